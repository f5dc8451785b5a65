//! Independent pieces of one stage's output computed side by side: the peer sets of a
//! translation, the sets of a render. Each piece is a function of its input alone and the
//! results come back in input order, so the output is what one thread computes; how many
//! cores there are only decides who computes what.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Below this much work (in the jobs' own unit: pods visited, elements written), one
/// thread does it all: threads cost more than they save.
pub(crate) const PARALLEL_WORK: usize = 20_000;

/// At most this many threads: the work is bound by memory reads, which a few cores already
/// keep busy (and a node agent shares its node).
const MAX_THREADS: usize = 4;

/// `f` of each job's item, in the jobs' order. A job is (its weight, its item); the heaviest
/// are started first, each by whichever thread is free, so the longest do not come last.
pub(crate) fn map<T: Sync, R: Send>(jobs: &[(usize, T)], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads_for(jobs);
    if threads <= 1 {
        return jobs.iter().map(|(_, item)| f(item)).collect();
    }
    #[cfg(test)]
    test_switch::SIDE_BY_SIDE.with(|n| n.set(n.get() + 1));
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|a, b| jobs[*b].0.cmp(&jobs[*a].0));
    let next = AtomicUsize::new(0);
    let worker = || {
        let mut done = Vec::new();
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            done.push((i, f(&jobs[i].1)));
        }
        done
    };
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    let done = std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads).map(|_| scope.spawn(worker)).collect();
        let mut all = worker();
        for t in others {
            all.extend(t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
        }
        all
    });
    for (i, r) in done {
        results[i] = Some(r);
    }
    // Every index was taken by exactly one thread.
    results.into_iter().flatten().collect()
}

/// Whether `jobs` weigh enough ([`PARALLEL_WORK`]) to be shared out at all.
pub(crate) fn worth_sharing<T>(jobs: &[(usize, T)]) -> bool {
    jobs.iter().map(|j| j.0).sum::<usize>() >= PARALLEL_WORK
}

/// How many threads share `jobs`: one unless they are [worth sharing](worth_sharing), else
/// one per core up to [`MAX_THREADS`] and no more than there are jobs.
fn threads_for<T>(jobs: &[(usize, T)]) -> usize {
    #[cfg(test)]
    if test_switch::ONE_THREAD.with(|one| one.get()) {
        return 1;
    }
    if !worth_sharing(jobs) {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS).min(jobs.len())
}

/// Lets a test compute the same output on one thread and on several, and see that the
/// second really was cut up (the switches are per calling thread, so tests running side by
/// side do not see each other's).
#[cfg(test)]
pub(crate) mod test_switch {
    use std::cell::Cell;

    thread_local! {
        pub(super) static ONE_THREAD: Cell<bool> = const { Cell::new(false) };
        pub(super) static SIDE_BY_SIDE: Cell<usize> = const { Cell::new(0) };
    }

    /// `f`, with every [`super::map`] it calls on this thread done on this thread alone.
    pub(crate) fn on_one_thread<R>(f: impl FnOnce() -> R) -> R {
        ONE_THREAD.with(|one| one.set(true));
        let out = f();
        ONE_THREAD.with(|one| one.set(false));
        out
    }

    /// How many [`super::map`] calls on this thread have used more than one thread.
    pub(crate) fn side_by_side() -> usize {
        SIDE_BY_SIDE.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render;
    use crate::synth::{self, Params};
    use crate::translate::{self, Options};

    #[test]
    fn results_come_in_input_order_on_one_thread_or_many() {
        // Weights past the threshold (several threads) and under it (one).
        for weight in [1, PARALLEL_WORK] {
            let jobs: Vec<(usize, u64)> = (0..200u64).map(|i| (weight * (1 + (i as usize * 7) % 5), i)).collect();
            let out = map(&jobs, |i| i * i);
            assert_eq!(out, (0..200u64).map(|i| i * i).collect::<Vec<_>>());
        }
        assert!(map(&[] as &[(usize, u8)], |x| *x).is_empty());
    }

    /// A snapshot past the threshold (its peer sets and their elements far over
    /// [`PARALLEL_WORK`]) translates and renders to the same policy and the same ruleset text
    /// on several threads as on one.
    #[test]
    fn a_large_snapshot_translates_and_renders_the_same_on_one_thread_or_many() {
        let params = Params { admin_policies: 8, baseline_policies: 3, ..Params::new(30_000, 300) };
        let cluster = synth::generate(&params);
        let s = &cluster.snapshot;
        let endpoints = s.derived_endpoints(&cluster.node);
        let options = Options::default();
        let one = test_switch::on_one_thread(|| {
            let np = translate::translate(s, &endpoints, &options);
            let text = render::render(&np).to_text();
            (np, text)
        });
        assert_eq!(test_switch::side_by_side(), 0);
        let np = translate::translate(s, &endpoints, &options);
        let text = render::render(&np).to_text();
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            // Both the translator's peer sets and the renderer's were cut up.
            assert!(test_switch::side_by_side() >= 2, "{} side-by-side runs", test_switch::side_by_side());
        }
        assert!(np.peer_sets.values().map(|p| p.v4.len() + p.v6.len()).sum::<usize>() >= PARALLEL_WORK);
        assert!(np == one.0, "the policy differs between one thread and many");
        assert!(text == one.1, "the ruleset text differs between one thread and many");
    }
}
