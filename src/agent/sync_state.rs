//! The sync loop's state and decisions, apart from its work: what woke it, whether it syncs
//! now or backs off, what a commit or a failure changes, when the drift baseline is read and
//! when a revocation sweep is due. [`LoopState`] is plain data with one method per event;
//! `sync_loop` (the module above) waits for events, does the work (translate and render,
//! apply, sweeps, baseline reads) and reports each outcome back. The clock is an argument,
//! so the unit tests below drive it event by event.

use std::time::{Duration, Instant};

use super::backoff::Backoff;
use crate::translate::PolicyProblem;

/// How long after the last transaction the drift baseline is read.
pub(crate) const BASELINE_QUIET: Duration = Duration::from_secs(1);
/// The shortest time between the starts of two revocation sweeps: a burst of commits
/// (ADDs) makes a few sweeps, not one each.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_millis(50);
/// Sweeps outdated in a row after which the next one holds the sync loop.
pub(crate) const STALE_SWEEPS: u32 = 3;
/// How long after the last CNI request that changed the endpoints pods still count as being
/// wired (a burst's next request comes sooner): a due sweep gives way to them.
pub(crate) const CNI_QUIET: Duration = Duration::from_millis(20);
/// How soon a sweep that gave way to CNI requests looks again.
pub(crate) const SWEEP_YIELD: Duration = Duration::from_millis(5);
/// The longest a due sweep gives way to CNI requests: revocation waits for a burst of pods
/// this long at most.
pub(crate) const SWEEP_YIELD_MAX: Duration = Duration::from_millis(200);

/// What woke the loop for a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The source or the endpoints changed.
    Changed,
    /// The periodic tick: the drift check is due.
    Tick,
    /// A full sync was asked for (the API came back after failing).
    FullResync,
    /// The backoff after a failed sync is over.
    RetryDue,
}

/// What one sync attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Attempt {
    /// Translates in full and checks drift.
    pub(crate) periodic: bool,
    /// Rewrites the table whatever the last commit was.
    pub(crate) forced: bool,
}

/// A committed sync, as the state needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Commit {
    pub(crate) attempt: Attempt,
    /// The transaction changed the table (not skipped as unchanged).
    pub(crate) applied: bool,
    /// The applier has no drift baseline of the table it committed.
    pub(crate) needs_baseline: bool,
    /// The source version the table holds now.
    pub(crate) source_version: u64,
}

/// What the loop does after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AfterCommit {
    /// Hash the committed ruleset (it changed, or none was hashed yet).
    pub(crate) hash: bool,
    /// The commit changes what a sweep must reflect (count it: a running sweep is outdated).
    pub(crate) count_for_sweeps: bool,
    /// Nothing changed the table since the last sweep: it holds for this source version.
    pub(crate) swept_holds: bool,
}

/// A finished revocation sweep, as the state needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SweepOutcome {
    /// Another sweep is owed (this one was outdated, failed, or left connections unmarked).
    pub(crate) owed: bool,
    /// A commit came while it ran: it judged a table that is gone.
    pub(crate) stale: bool,
}

/// The sync loop's state between events.
#[derive(Debug)]
pub(crate) struct LoopState {
    revoke: bool,
    pending: Attempt,
    backoff: Backoff,
    /// While failing syncs back off: when the next attempt is due.
    retry_at: Option<Instant>,
    /// When the drift baseline is to be read, and whether a read is running.
    baseline_at: Option<Instant>,
    reading_baseline: bool,
    /// Since when a committed table has had no baseline.
    unverified_since: Option<Instant>,
    /// The source version whose changes' latency was last reported.
    last_observed: u64,
    /// The endpoint generation of the last sync (how many changes one sync coalesced).
    last_generation: u64,
    /// The problems logged (each once, when it appears): the policies', the overlay guard's.
    reported: Vec<PolicyProblem>,
    reported_overlay: Vec<String>,
    /// Whether a ruleset was left for hashing yet (the first commit's is, changed or not).
    digest_owed: bool,
    /// A revocation sweep is owed: the first commit of this agent (connections may predate
    /// a change committed before a restart), a commit since the last, or the last failed.
    sweep_owed: bool,
    sweeping: bool,
    /// When the owed sweep starts, and when the last one did.
    sweep_at: Option<Instant>,
    last_sweep: Option<Instant>,
    stale_streak: u32,
    /// Since when the owed sweep has been giving way to CNI requests.
    yielding_since: Option<Instant>,
    /// The source version the table holds, while the last sync committed (`None` after a
    /// failed one: the kept translation is then ahead of the table, and nothing is judged
    /// with it until a commit).
    committed_version: Option<u64>,
}

impl LoopState {
    /// `revoke`: whether established connections are revoked (sweeps run).
    pub(crate) fn new(revoke: bool, backoff: Backoff) -> Self {
        Self {
            revoke,
            pending: Attempt::default(),
            backoff,
            retry_at: None,
            baseline_at: None,
            reading_baseline: false,
            unverified_since: None,
            last_observed: 0,
            last_generation: 0,
            reported: Vec::new(),
            reported_overlay: Vec::new(),
            digest_owed: true,
            sweep_owed: revoke,
            sweeping: false,
            sweep_at: None,
            last_sweep: None,
            stale_streak: 0,
            yielding_since: None,
            committed_version: None,
        }
    }

    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    pub(crate) fn baseline_at(&self) -> Option<Instant> {
        self.baseline_at
    }

    /// When a sweep is to start (none while one runs).
    pub(crate) fn sweep_at(&self) -> Option<Instant> {
        self.sweep_at.filter(|_| !self.sweeping)
    }

    pub(crate) fn last_observed(&self) -> u64 {
        self.last_observed
    }

    pub(crate) fn committed_version(&self) -> Option<u64> {
        self.committed_version
    }

    pub(crate) fn failures(&self) -> u32 {
        self.backoff.failures()
    }

    /// Something woke the loop for a sync.
    pub(crate) fn wake(&mut self, w: Wake) {
        match w {
            Wake::Changed => {}
            Wake::Tick => self.pending.periodic = true,
            Wake::FullResync => self.pending.forced = true,
            Wake::RetryDue => self.retry_at = None,
        }
    }

    /// Whether to sync now: not while backing off, unless a CNI request waits (`urgent`);
    /// what waits is taken in by the attempt at the deadline (level-triggered).
    pub(crate) fn may_sync(&self, urgent: bool) -> bool {
        self.retry_at.is_none() || urgent
    }

    /// A sync starts: it takes what was pending (a failed one gives it back). With `urgent`
    /// (a CNI request waits), the periodic full translation and drift check — a long sync
    /// at scale — is left pending for the next one, so that the pod is not queued behind it
    /// ([`Self::owes_periodic`]).
    pub(crate) fn start(&mut self, urgent: bool) -> Attempt {
        if urgent {
            return Attempt { periodic: false, forced: std::mem::take(&mut self.pending.forced) };
        }
        std::mem::take(&mut self.pending)
    }

    /// A periodic sync is owed (deferred for a CNI request): the loop wakes itself for it.
    pub(crate) fn owes_periodic(&self) -> bool {
        self.pending.periodic
    }

    /// How many changes the sync of endpoint `generation` coalesced beyond the first.
    pub(crate) fn coalesced(&mut self, generation: u64) -> u64 {
        let n = generation.saturating_sub(self.last_generation).saturating_sub(1);
        self.last_generation = generation;
        n
    }

    /// The problems of this sync not logged yet; `problems` sorted.
    pub(crate) fn new_problems<'a>(&mut self, problems: &'a [PolicyProblem]) -> Vec<&'a PolicyProblem> {
        newly_seen(&mut self.reported, problems)
    }

    /// The overlay guard's problems of this sync not logged yet; `problems` sorted.
    pub(crate) fn new_overlay_problems<'a>(&mut self, problems: &'a [String]) -> Vec<&'a String> {
        newly_seen(&mut self.reported_overlay, problems)
    }

    /// How long the committed table has had no baseline.
    pub(crate) fn unverified_for(&self, now: Instant) -> Duration {
        self.unverified_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// An apply ran (committed or not): whether the applier now lacks a baseline.
    pub(crate) fn applied(&mut self, needs_baseline: bool, now: Instant) {
        self.unverified_since = if needs_baseline { self.unverified_since.or(Some(now)) } else { None };
    }

    /// A sync committed.
    pub(crate) fn committed(&mut self, c: Commit, now: Instant) -> AfterCommit {
        self.backoff.reset();
        self.retry_at = None;
        if c.needs_baseline {
            self.baseline_at = Some(now + BASELINE_QUIET);
        }
        self.last_observed = c.source_version;
        let hash = std::mem::take(&mut self.digest_owed) || c.applied;
        let count_for_sweeps = self.revoke && (c.attempt.periodic || c.applied);
        self.sweep_owed |= count_for_sweeps;
        self.committed_version = Some(c.source_version);
        let swept_holds = self.revoke && !self.sweep_owed && !self.sweeping;
        if self.sweep_owed && !self.sweeping {
            self.sweep_at = Some(self.next_sweep(now));
        }
        AfterCommit { hash, count_for_sweeps, swept_holds }
    }

    /// A sync failed: the previous ruleset stays; it retries after the returned delay, and
    /// what it was asked for is owed still.
    pub(crate) fn failed(&mut self, attempt: Attempt, now: Instant) -> Duration {
        self.committed_version = None;
        let delay = self.backoff.fail();
        self.retry_at = Some(now + delay);
        self.pending.forced |= attempt.forced;
        self.pending.periodic |= attempt.periodic;
        delay
    }

    /// The baseline's time came: whether to start reading it (none is running).
    pub(crate) fn baseline_due(&mut self) -> bool {
        self.baseline_at = None;
        !self.reading_baseline
    }

    pub(crate) fn baseline_started(&mut self) {
        self.reading_baseline = true;
    }

    /// A baseline read ended: `accepted` by the applier, or, when not, whether one is still
    /// needed (a transaction committed during the read: read again once quiet). A failed
    /// read is neither; the next drift check reads the table.
    pub(crate) fn baseline_read(&mut self, accepted: bool, still_needed: bool, now: Instant) {
        self.reading_baseline = false;
        if accepted {
            self.unverified_since = None;
        } else if still_needed {
            self.baseline_at = Some(now + BASELINE_QUIET);
        }
    }

    /// The sweep's time came: the source version to sweep for, if one is owed and the table
    /// holds a commit (the caller starts it and says so: [`Self::sweep_started`]).
    pub(crate) fn sweep_due(&mut self, stopping: bool) -> Option<u64> {
        self.sweep_at = None;
        self.committed_version.filter(|_| self.sweep_owed && !stopping)
    }

    /// The sweep's time came while pods are being wired (CNI requests in flight or just
    /// answered): whether it gives way to them — a sweep's conntrack dump takes a core for
    /// milliseconds, which the ADDs' syncs would wait for — and looks again after
    /// [`SWEEP_YIELD`]. It does for at most [`SWEEP_YIELD_MAX`] since it first gave way; a
    /// sweep that holds the loop never does.
    pub(crate) fn sweep_gives_way(&mut self, now: Instant) -> bool {
        if !self.sweep_owed || self.sweeping || self.committed_version.is_none() {
            return false;
        }
        let since = *self.yielding_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= SWEEP_YIELD_MAX {
            return false;
        }
        self.sweep_at = Some(now + SWEEP_YIELD);
        true
    }

    /// A sweep was started (`true`) or could not be (revocation or the translation gone).
    pub(crate) fn sweep_started(&mut self, started: bool, now: Instant) {
        self.yielding_since = None;
        self.last_sweep = Some(now);
        self.sweeping = started;
        self.sweep_owed = !started;
    }

    /// A sweep ended. `Some(version)`: commits kept outdating the sweeps (changes faster than
    /// a sweep), so the next one, for `version`, holds the loop until done — no commit can
    /// outdate it; the caller runs it and reports it here again (or, when it cannot start
    /// one, [`Self::sweep_not_started`]). `None`: the next is scheduled if owed.
    pub(crate) fn sweep_finished(&mut self, outcome: SweepOutcome, stopping: bool, now: Instant) -> Option<u64> {
        self.sweeping = false;
        self.sweep_owed |= outcome.owed;
        let version = self.committed_version?;
        if self.sweep_owed && !stopping {
            self.stale_streak = if outcome.stale { self.stale_streak + 1 } else { 0 };
            if self.stale_streak >= STALE_SWEEPS {
                self.last_sweep = Some(now);
                self.sweep_owed = false;
                self.sweeping = true;
                return Some(version);
            }
        }
        if self.sweep_owed {
            self.sweep_at = Some(self.next_sweep(now));
        }
        None
    }

    /// The holding sweep [`Self::sweep_finished`] asked for could not start.
    pub(crate) fn sweep_not_started(&mut self, now: Instant) {
        self.sweeping = false;
        self.sweep_owed = true;
        self.sweep_at = Some(self.next_sweep(now));
    }

    /// When the next sweep may start: at once, but [`SWEEP_INTERVAL`] after the last start.
    fn next_sweep(&self, now: Instant) -> Instant {
        self.last_sweep.map_or(now, |l| (l + SWEEP_INTERVAL).max(now))
    }
}

/// What of `now` (sorted) is not in `reported`; `reported` becomes `now`.
fn newly_seen<'a, T: Ord + Clone>(reported: &mut Vec<T>, now: &'a [T]) -> Vec<&'a T> {
    let new = now.iter().filter(|p| reported.binary_search(p).is_err()).collect();
    *reported = now.to_vec();
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(revoke: bool) -> LoopState {
        LoopState::new(revoke, Backoff::new(7))
    }

    fn commit(periodic: bool, applied: bool, version: u64) -> Commit {
        Commit { attempt: Attempt { periodic, forced: false }, applied, needs_baseline: false, source_version: version }
    }

    #[test]
    fn a_failed_sync_backs_off_and_owes_what_it_was_asked() {
        let t0 = Instant::now();
        let mut s = state(false);
        s.wake(Wake::Tick);
        s.wake(Wake::FullResync);
        assert!(s.may_sync(false));
        let attempt = s.start(false);
        assert_eq!(attempt, Attempt { periodic: true, forced: true });
        assert_eq!(s.start(false), Attempt::default(), "taken");
        let delay = s.failed(attempt, t0);
        assert!(delay >= Duration::from_millis(800), "{delay:?}");
        assert_eq!((s.retry_at(), s.failures(), s.committed_version()), (Some(t0 + delay), 1, None));
        // Backing off: a change waits, a CNI request does not.
        s.wake(Wake::Changed);
        assert!(!s.may_sync(false));
        assert!(s.may_sync(true));
        // At the deadline the attempt takes in the owed periodic and forced sync.
        s.wake(Wake::RetryDue);
        assert!(s.may_sync(false));
        assert_eq!(s.start(false), attempt);
        // Failing again doubles (with jitter); a commit resets it.
        let second = s.failed(attempt, t0);
        assert!(second > delay, "{second:?} after {delay:?}");
        s.start(false);
        s.committed(commit(true, true, 3), t0);
        assert_eq!((s.retry_at(), s.failures(), s.committed_version()), (None, 0, Some(3)));
    }

    #[test]
    fn a_cni_request_is_not_queued_behind_the_periodic_check() {
        let mut s = state(false);
        s.wake(Wake::Tick);
        s.wake(Wake::FullResync);
        // A pod waits: this sync is a quick one (a forced rewrite is not deferred)...
        assert_eq!(s.start(true), Attempt { periodic: false, forced: true });
        // ...and the full translation and drift check come next.
        assert!(s.owes_periodic());
        assert_eq!(s.start(false), Attempt { periodic: true, forced: false });
        assert!(!s.owes_periodic());
        // Nothing pending: an urgent sync is a plain one.
        assert_eq!(s.start(true), Attempt::default());
    }

    #[test]
    fn the_first_commit_is_hashed_then_only_changes() {
        let t0 = Instant::now();
        let mut s = state(false);
        assert!(s.committed(commit(false, false, 1), t0).hash, "the first, unchanged or not");
        assert!(!s.committed(commit(false, false, 2), t0).hash);
        assert!(s.committed(commit(false, true, 3), t0).hash);
        assert_eq!(s.last_observed(), 3);
    }

    #[test]
    fn the_baseline_is_read_once_quiet_and_again_after_a_commit_during_the_read() {
        let t0 = Instant::now();
        let mut s = state(false);
        let mut c = commit(false, true, 1);
        c.needs_baseline = true;
        s.applied(true, t0);
        s.committed(c, t0);
        assert_eq!(s.baseline_at(), Some(t0 + BASELINE_QUIET));
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(s.unverified_for(t1), Duration::from_secs(5));
        assert!(s.baseline_due());
        s.baseline_started();
        assert_eq!(s.baseline_at(), None);
        // Due again while reading: no second read.
        assert!(!s.baseline_due());
        // A transaction committed during the read: not accepted, read again once quiet.
        s.baseline_read(false, true, t1);
        assert_eq!(s.baseline_at(), Some(t1 + BASELINE_QUIET));
        assert!(s.baseline_due());
        s.baseline_started();
        s.baseline_read(true, false, t1);
        assert_eq!(s.unverified_for(t1 + Duration::from_secs(9)), Duration::ZERO);
        // An apply that leaves the table unverified starts counting; one that does not stops.
        s.applied(true, t1);
        s.applied(true, t1 + Duration::from_secs(1));
        assert_eq!(s.unverified_for(t1 + Duration::from_secs(2)), Duration::from_secs(2), "from the first");
        s.applied(false, t1);
        assert_eq!(s.unverified_for(t1 + Duration::from_secs(2)), Duration::ZERO);
    }

    #[test]
    fn sweeps_follow_commits_at_most_every_interval() {
        let t0 = Instant::now();
        let mut s = state(true);
        // Nothing committed yet: no sweep, though one is owed (connections may predate a
        // restart).
        assert_eq!(s.sweep_due(false), None);
        let after = s.committed(commit(false, false, 1), t0);
        assert!(!after.count_for_sweeps && !after.swept_holds, "owed since the start");
        assert_eq!(s.sweep_at(), Some(t0));
        assert_eq!(s.sweep_due(false), Some(1));
        s.sweep_started(true, t0);
        assert_eq!(s.sweep_at(), None, "none scheduled while one runs");
        // A commit that changes the table while it runs: counted, owed, not scheduled yet.
        let after = s.committed(commit(false, true, 2), t0 + Duration::from_millis(10));
        assert!(after.count_for_sweeps && !after.swept_holds);
        assert_eq!(s.sweep_at(), None);
        // The sweep ends (outdated): the next starts an interval after the last start.
        let t1 = t0 + Duration::from_millis(20);
        assert_eq!(s.sweep_finished(SweepOutcome { owed: true, stale: true }, false, t1), None);
        assert_eq!(s.sweep_at(), Some(t0 + SWEEP_INTERVAL));
        assert_eq!(s.sweep_due(false), Some(2));
        s.sweep_started(true, t0 + SWEEP_INTERVAL);
        assert_eq!(s.sweep_finished(SweepOutcome { owed: false, stale: false }, false, t1), None);
        assert_eq!(s.sweep_at(), None, "nothing owed");
        // An unchanged, non-periodic commit leaves the swept table as it is.
        let after = s.committed(commit(false, false, 3), t1);
        assert!(!after.count_for_sweeps && after.swept_holds);
        // A periodic one sweeps again (connections of the table's whole life are judged).
        assert!(s.committed(commit(true, false, 4), t1).count_for_sweeps);
        // Stopping: no sweep starts.
        assert_eq!(s.sweep_due(true), None);
    }

    #[test]
    fn sweeps_outdated_in_a_row_make_the_next_hold_the_loop() {
        let t0 = Instant::now();
        let mut s = state(true);
        s.committed(commit(false, true, 1), t0);
        for i in 1..STALE_SWEEPS {
            assert_eq!(s.sweep_due(false), Some(1));
            s.sweep_started(true, t0);
            assert_eq!(s.sweep_finished(SweepOutcome { owed: true, stale: true }, false, t0), None, "stale sweep {i}");
        }
        assert_eq!(s.sweep_due(false), Some(1));
        s.sweep_started(true, t0);
        // The third in a row: the next runs now, holding the loop.
        assert_eq!(s.sweep_finished(SweepOutcome { owed: true, stale: true }, false, t0), Some(1));
        assert_eq!(s.sweep_at(), None);
        // It could not start: scheduled as usual.
        s.sweep_not_started(t0);
        assert!(s.sweep_at().is_some());
        // A failed sync: nothing is swept with a translation ahead of the table.
        s.failed(Attempt::default(), t0);
        assert_eq!(s.sweep_due(false), None);
        assert_eq!(s.sweep_finished(SweepOutcome { owed: true, stale: false }, false, t0), None);
    }

    #[test]
    fn a_due_sweep_gives_way_to_cni_requests_for_a_bounded_while() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = state(true);
        // Nothing committed: no sweep is due, none gives way.
        assert!(!s.sweep_gives_way(t0));
        s.committed(commit(false, true, 1), t0);
        assert!(s.sweep_gives_way(t0));
        assert_eq!(s.sweep_at(), Some(t0 + SWEEP_YIELD), "it looks again shortly");
        assert!(s.sweep_gives_way(t0 + SWEEP_YIELD_MAX - ms(1)));
        // A burst that goes on: the sweep starts anyway, its bound reached.
        assert!(!s.sweep_gives_way(t0 + SWEEP_YIELD_MAX));
        assert_eq!(s.sweep_due(false), Some(1));
        s.sweep_started(true, t0 + SWEEP_YIELD_MAX);
        // While it runs, and once nothing is owed, there is nothing to give way.
        assert!(!s.sweep_gives_way(t0 + SWEEP_YIELD_MAX));
        s.sweep_finished(SweepOutcome { owed: false, stale: false }, false, t0 + SWEEP_YIELD_MAX + ms(10));
        assert!(!s.sweep_gives_way(t0 + SWEEP_YIELD_MAX + ms(10)));
        // The next owed sweep has its own bound, counted from when it first gives way.
        let t1 = t0 + ms(500);
        s.committed(commit(false, true, 2), t1);
        assert!(s.sweep_gives_way(t1 + ms(50)));
        assert!(s.sweep_gives_way(t1 + ms(50) + SWEEP_YIELD_MAX - ms(1)));
        assert!(!s.sweep_gives_way(t1 + ms(50) + SWEEP_YIELD_MAX));
    }

    #[test]
    fn without_revocation_nothing_is_swept() {
        let t0 = Instant::now();
        let mut s = state(false);
        let after = s.committed(commit(true, true, 1), t0);
        assert!(!after.count_for_sweeps && !after.swept_holds);
        assert_eq!((s.sweep_at(), s.sweep_due(false)), (None, None));
    }

    #[test]
    fn problems_are_new_once_and_syncs_count_what_they_coalesced() {
        let mut s = state(false);
        let p = |m: &str| PolicyProblem {
            kind: crate::translate::ir::PolicyKind::NetworkPolicy,
            policy: crate::model::ObjectRef::new("ns", "p"),
            field: "spec".into(),
            message: m.into(),
        };
        let first = [p("a"), p("b")];
        assert_eq!(s.new_problems(&first).len(), 2);
        assert!(s.new_problems(&first).is_empty());
        let second = [p("b"), p("c")];
        assert_eq!(s.new_problems(&second), [&p("c")]);
        assert_eq!(s.coalesced(1), 0);
        assert_eq!(s.coalesced(5), 3);
        assert_eq!(s.coalesced(5), 0);
    }
}
