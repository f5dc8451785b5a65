//! The API server's health as the agent sees it, judged from the watches themselves, and the
//! probe that stands in for them only while they are quiet.
//!
//! Every watch reports proof of health (an event, a bookmark, a finished list, a watch that
//! stayed open without an error or ended cleanly) and failures (a failed list or watch
//! request, an ERROR event, an undecodable line). The health is Connected only while no watch
//! and no probe is failing; once something has been failing for `degraded_after` it is
//! Degraded, for `disconnected_after` Disconnected. The failure ends when every source is
//! healthy again — a recovery, which the agent turns into a full sync.
//!
//! `/version` is probed only when no watch has delivered anything for [`ProbeConfig::quiet`]
//! plus a jitter (so the nodes of a cluster do not probe in step) and no watch is failing
//! (a failing watch's retries are probes already): a busy or bookmarking cluster sends no
//! probes at all. The jitter is a pure function of a seed (the node's name) and the probe's
//! number, so tests can pin it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Resource;
use super::SourceMetrics;

/// The API server's health as the agent sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Connected,
    Degraded,
    Disconnected,
}

impl HealthState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "Connected",
            Self::Degraded => "Degraded",
            Self::Disconnected => "Disconnected",
        }
    }
}

/// When the API server is probed (`/version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Probe once no watch has delivered anything for this long.
    pub quiet: Duration,
    /// Plus up to this much, chosen per probe from `seed`.
    pub jitter: Duration,
    /// Seeds the jitter; one per node (its name) spreads the probes of a cluster.
    pub seed: u64,
    /// A probe without an answer within this has failed.
    pub timeout: Duration,
    /// After a failed probe the next one comes this much later, doubling up to `quiet`.
    pub retry: Duration,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            quiet: Duration::from_secs(30),
            jitter: Duration::from_secs(15),
            seed: 0,
            timeout: Duration::from_secs(5),
            retry: Duration::from_secs(1),
        }
    }
}

/// A stable seed from a name (e.g. the node's), for jitter that differs between nodes.
pub fn seed_from(name: &str) -> u64 {
    // FNV-1a: stable across builds and platforms.
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The `n`th value of a deterministic sequence in `[0, 1)` (SplitMix64).
pub(crate) fn unit_jitter(seed: u64, n: u64) -> f64 {
    let mut z = seed.wrapping_add(n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // The top 53 bits, exactly representable.
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl ProbeConfig {
    /// How long the watches must be quiet before probe number `n`.
    pub(crate) fn quiet_before(&self, n: u64) -> Duration {
        self.quiet + self.jitter.mul_f64(unit_jitter(self.seed, n))
    }
}

/// What `/healthz` shows of the API health.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthReport {
    pub(crate) state: HealthState,
    /// The last error seen (a failure, or what made a watch relist), and how long ago.
    pub last_error: Option<(String, Duration)>,
    /// Per watch: whether it is healthy.
    pub watches: Vec<(Resource, bool)>,
    /// Whether the last probe failed (and nothing has answered since).
    pub(crate) probe_failing: bool,
}

#[derive(Debug)]
struct Inner {
    /// Watches whose last outcome was a failure.
    failing: BTreeMap<Resource, bool>,
    probe_failing: bool,
    /// Since when something has been failing without a moment of full health.
    failing_since: Option<Instant>,
    last_error: Option<(String, Instant)>,
    /// The last proof of health from any watch, or the last answered probe.
    last_contact: Instant,
}

impl Inner {
    fn any_failing(&self) -> bool {
        self.probe_failing || self.failing.values().any(|f| *f)
    }

    fn fail(&mut self, now: Instant, error: String) {
        self.last_error = Some((error, now));
        self.failing_since.get_or_insert(now);
    }

    /// Ends the failure if nothing fails any more; returns whether it did (a recovery).
    fn settle(&mut self) -> bool {
        !self.any_failing() && self.failing_since.take().is_some()
    }
}

/// Health of the API server, shared by the watches, the probe, `/healthz`, `/metrics` and
/// the agent (see the module docs).
#[derive(Debug)]
pub struct ApiHealth {
    degraded_after: Duration,
    disconnected_after: Duration,
    inner: Mutex<Inner>,
    /// Bumped when the API comes back after failing: the agent does a full sync.
    resync: watch::Sender<u64>,
}

/// What a piece of proof changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Proof {
    /// The watch had been failing.
    pub(crate) watch_recovered: bool,
    /// Nothing fails any more after a failure: a recovery (the agent resyncs).
    pub(crate) recovered: bool,
}

impl ApiHealth {
    pub fn new(degraded_after: Duration, disconnected_after: Duration) -> Self {
        let inner =
            Inner { failing: BTreeMap::new(), probe_failing: false, failing_since: None, last_error: None, last_contact: Instant::now() };
        Self { degraded_after, disconnected_after, inner: Mutex::new(inner), resync: watch::channel(0).0 }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        match self.inner.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    fn recovered(&self, recovered: bool) {
        if recovered {
            self.resync.send_modify(|n| *n += 1);
        }
    }

    /// A watch proved healthy (an event, a bookmark, a list, a watch open without error).
    /// It also proves the API server answers, which ends a probe failure.
    pub(crate) fn watch_ok(&self, r: Resource) -> Proof {
        self.watch_ok_at(r, Instant::now())
    }

    pub(crate) fn watch_ok_at(&self, r: Resource, now: Instant) -> Proof {
        let proof = self.with(|h| {
            let watch_recovered = h.failing.insert(r, false).unwrap_or(false);
            h.probe_failing = false;
            h.last_contact = now;
            Proof { watch_recovered, recovered: h.settle() }
        });
        self.recovered(proof.recovered);
        proof
    }

    /// A watch failed. Returns whether it had been healthy.
    pub(crate) fn watch_error(&self, r: Resource, e: &str) -> bool {
        self.watch_error_at(r, e, Instant::now())
    }

    pub(crate) fn watch_error_at(&self, r: Resource, e: &str, now: Instant) -> bool {
        self.with(|h| {
            h.fail(now, format!("{}: {e}", r.as_str()));
            !h.failing.insert(r, true).unwrap_or(false)
        })
    }

    /// Something worth showing that is not a failure (why a watch relists).
    pub(crate) fn note(&self, r: Resource, e: &str) {
        self.with(|h| h.last_error = Some((format!("{}: {e}", r.as_str()), Instant::now())));
    }

    /// A probe answered. Returns whether that ended a failure.
    pub(crate) fn probe_ok(&self) -> bool {
        self.probe_ok_at(Instant::now())
    }

    pub(crate) fn probe_ok_at(&self, now: Instant) -> bool {
        let recovered = self.with(|h| {
            h.probe_failing = false;
            h.last_contact = now;
            h.settle()
        });
        self.recovered(recovered);
        recovered
    }

    /// A probe failed.
    pub(crate) fn probe_error(&self, e: &str) {
        self.probe_error_at(e, Instant::now());
    }

    pub(crate) fn probe_error_at(&self, e: &str, now: Instant) {
        self.with(|h| {
            h.probe_failing = true;
            h.fail(now, format!("probe: {e}"));
        });
    }

    /// The state now.
    pub fn state(&self) -> HealthState {
        self.state_at(Instant::now())
    }

    pub(crate) fn state_at(&self, now: Instant) -> HealthState {
        match self.with(|h| h.failing_since.map(|t| now.saturating_duration_since(t))) {
            Some(d) if d >= self.disconnected_after => HealthState::Disconnected,
            Some(d) if d >= self.degraded_after => HealthState::Degraded,
            _ => HealthState::Connected,
        }
    }

    /// Whether `r`'s last outcome was a failure.
    pub fn watch_failing(&self, r: Resource) -> bool {
        self.with(|h| h.failing.get(&r).copied().unwrap_or(false))
    }

    /// Whether any watch is failing.
    pub fn any_watch_failing(&self) -> bool {
        self.with(|h| h.failing.values().any(|f| *f))
    }

    /// Whether the last probe failed and nothing has answered since.
    pub(crate) fn probe_failing(&self) -> bool {
        self.with(|h| h.probe_failing)
    }

    /// The last proof of health (any watch, or an answered probe).
    pub(crate) fn last_contact(&self) -> Instant {
        self.with(|h| h.last_contact)
    }

    /// The last error seen.
    pub fn last_error(&self) -> Option<String> {
        self.with(|h| h.last_error.as_ref().map(|(e, _)| e.clone()))
    }

    /// What `/healthz` shows.
    pub fn report(&self) -> HealthReport {
        let now = Instant::now();
        let state = self.state_at(now);
        self.with(|h| HealthReport {
            state,
            last_error: h.last_error.as_ref().map(|(e, at)| (e.clone(), now.saturating_duration_since(*at))),
            // PodSlices only where they are watched (they have said something).
            watches: Resource::ALL
                .iter()
                .filter(|r| **r != Resource::PodSlices || h.failing.contains_key(r))
                .map(|r| (*r, !h.failing.get(r).copied().unwrap_or(false)))
                .collect(),
            probe_failing: h.probe_failing,
        })
    }

    /// Sets the health gauges (`api_health_state`, `watch_connected`) to what this says.
    pub fn export(&self, metrics: &dyn SourceMetrics) {
        let report = self.report();
        metrics.health(report.state.as_str());
        for (r, ok) in report.watches {
            metrics.watch(r.as_str(), ok);
        }
    }

    /// Recoveries so far (the agent subscribes and does a full sync on each).
    pub fn resyncs(&self) -> watch::Receiver<u64> {
        self.resync.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn connected_only_while_every_watch_is_healthy() {
        let h = ApiHealth::new(50 * MS, 150 * MS);
        let t0 = Instant::now();
        let resyncs = h.resyncs();
        assert_eq!(h.state_at(t0), HealthState::Connected);
        assert!(h.watch_error_at(Resource::NetworkPolicies, "500 InternalError", t0));
        assert!(!h.watch_error_at(Resource::NetworkPolicies, "500 InternalError", t0 + 10 * MS), "already failing");
        assert_eq!(h.state_at(t0 + 40 * MS), HealthState::Connected, "a blip is not degraded yet");
        // Other watches and probes answering do not end the failing watch's failure.
        assert_eq!(h.watch_ok_at(Resource::Pods, t0 + 45 * MS), Proof::default());
        assert!(!h.probe_ok_at(t0 + 45 * MS));
        assert_eq!(h.state_at(t0 + 60 * MS), HealthState::Degraded);
        assert_eq!(h.state_at(t0 + 200 * MS), HealthState::Disconnected);
        assert!(h.watch_failing(Resource::NetworkPolicies) && !h.watch_failing(Resource::Pods));
        let report = h.report();
        assert!(report.last_error.unwrap().0.contains("networkpolicies: 500 InternalError"));
        assert!(report.watches.contains(&(Resource::NetworkPolicies, false)) && report.watches.contains(&(Resource::Pods, true)));
        assert_eq!(*resyncs.borrow(), 0);
        // Its own proof ends it: a recovery, and a full resync.
        let proof = h.watch_ok_at(Resource::NetworkPolicies, t0 + 210 * MS);
        assert_eq!(proof, Proof { watch_recovered: true, recovered: true });
        assert_eq!(*resyncs.borrow(), 1);
        assert_eq!(h.state_at(t0 + 210 * MS), HealthState::Connected);
        // The last error stays visible.
        assert!(h.last_error().unwrap().contains("networkpolicies"));
    }

    #[test]
    fn a_failure_lasts_until_everything_is_healthy_at_once() {
        let h = ApiHealth::new(50 * MS, 150 * MS);
        let t0 = Instant::now();
        h.watch_error_at(Resource::Pods, "reset", t0);
        h.watch_error_at(Resource::Nodes, "reset", t0 + 30 * MS);
        assert!(!h.watch_ok_at(Resource::Pods, t0 + 40 * MS).recovered);
        // Counted from the first failure, not the one still going.
        assert_eq!(h.state_at(t0 + 60 * MS), HealthState::Degraded);
        assert!(h.watch_ok_at(Resource::Nodes, t0 + 70 * MS).recovered);
    }

    #[test]
    fn probes_fail_alone_and_any_answer_ends_that() {
        let h = ApiHealth::new(50 * MS, 150 * MS);
        let t0 = Instant::now();
        h.probe_error_at("no answer within 5s", t0);
        assert!(h.probe_failing());
        assert!(!h.any_watch_failing());
        assert_eq!(h.state_at(t0 + 60 * MS), HealthState::Degraded);
        assert!(h.last_error().unwrap().starts_with("probe: "));
        // A watch event proves the server answers.
        assert!(h.watch_ok_at(Resource::Pods, t0 + 70 * MS).recovered);
        assert!(!h.probe_failing());
        assert_eq!(h.last_contact(), t0 + 70 * MS);
        h.probe_error_at("refused", t0 + 80 * MS);
        assert!(h.probe_ok_at(t0 + 90 * MS));
        assert_eq!(h.state_at(t0 + 300 * MS), HealthState::Connected);
    }

    #[test]
    fn probe_jitter_is_deterministic_and_bounded() {
        let cfg = ProbeConfig {
            quiet: Duration::from_secs(30),
            jitter: Duration::from_secs(15),
            seed: seed_from("node-7"),
            ..Default::default()
        };
        let waits: Vec<Duration> = (0..100).map(|n| cfg.quiet_before(n)).collect();
        assert!(waits.iter().all(|w| *w >= Duration::from_secs(30) && *w < Duration::from_secs(45)), "{waits:?}");
        assert_eq!(waits, (0..100).map(|n| cfg.quiet_before(n)).collect::<Vec<_>>());
        // Spread out, and different on another node.
        let distinct: std::collections::BTreeSet<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert!(distinct.len() > 90);
        let other = ProbeConfig { seed: seed_from("node-8"), ..cfg.clone() };
        assert_ne!(cfg.quiet_before(0), other.quiet_before(0));
        // No jitter: exactly the quiet period.
        let fixed = ProbeConfig { jitter: Duration::ZERO, ..cfg };
        assert_eq!(fixed.quiet_before(3), Duration::from_secs(30));
        let mean = (0..10_000).map(|n| unit_jitter(1, n)).sum::<f64>() / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }
}
