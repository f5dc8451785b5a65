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
    let work: usize = jobs.iter().map(|j| j.0).sum();
    let threads =
        if work < PARALLEL_WORK { 1 } else { std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS).min(jobs.len()) };
    if threads <= 1 {
        return jobs.iter().map(|(_, item)| f(item)).collect();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
