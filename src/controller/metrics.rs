//! flock-controller's Prometheus metrics (`/metrics`): policies applied by result,
//! withdrawals (policies found deleted and re-created), whether enforcement is enabled for
//! new runs, reconcile durations and failures, runs in backoff, leadership — all
//! `flock_controller_*` — and `flock_build_info{version,commit}`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::process::{MetricLabels as Labels, metric_label as label};

/// How an apply ended, for `policies_applied_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyResult {
    /// The run's first policy.
    Created,
    /// A policy that had been applied was missing and was re-created (a withdrawal).
    Recreated,
    /// An existing policy was applied again (changed, or already equal).
    Applied,
    /// The API server refused or failed.
    Failed,
}

impl ApplyResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Recreated => "recreated",
            Self::Applied => "applied",
            Self::Failed => "failed",
        }
    }
}

/// All of flock-controller's metrics.
pub struct Metrics {
    registry: Registry,
    applied: Family<Labels, Counter>,
    withdrawn: Counter,
    deleted: Counter,
    enforcement: Gauge,
    reconcile_duration: Family<Labels, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<Labels, Counter>,
    runs_in_backoff: Gauge,
    leader: Gauge,
    audit_events: Family<Labels, Counter>,
    audit_collected: Counter,
    audit_errors: Counter,
    slice_writes: Family<Labels, Counter>,
    slices: Gauge,
    slice_pods: Gauge,
    slice_pods_left_out: Gauge,
}

fn duration_histogram() -> Histogram {
    // 1 ms … ~16 s
    crate::process::duration_histogram(15)
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // `flock_build_info` is shared with flock-agent; everything else is the controller's.
        let mut root = Registry::with_prefix("flock");
        crate::process::register_build_info(&mut root);
        let r = root.sub_registry_with_prefix("controller");
        let m = Self {
            applied: Family::default(),
            withdrawn: Counter::default(),
            deleted: Counter::default(),
            enforcement: Gauge::default(),
            reconcile_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            reconcile_errors: Family::default(),
            runs_in_backoff: Gauge::default(),
            leader: Gauge::default(),
            audit_events: Family::default(),
            audit_collected: Counter::default(),
            audit_errors: Counter::default(),
            slice_writes: Family::default(),
            slices: Gauge::default(),
            slice_pods: Gauge::default(),
            slice_pods_left_out: Gauge::default(),
            registry: Registry::default(),
        };
        r.register("policies_applied", "Run policies applied, by result (created, recreated, applied, failed)", m.applied.clone());
        r.register(
            "policies_withdrawn",
            "Run policies found deleted after they had been applied (each re-created, with a NetworkPolicyWithdrawn event)",
            m.withdrawn.clone(),
        );
        r.register("policies_deleted", "Stale run policies deleted (runs whose pinned decision is not to enforce)", m.deleted.clone());
        r.register("enforcement_enabled", "Whether new runs' policies are enforced (1) or not (0)", m.enforcement.clone());
        r.register("reconcile_duration_seconds", "Duration of a reconcile, by kind (Run, RunProfile)", m.reconcile_duration.clone());
        r.register("reconcile_errors", "Reconciles that ended in an API error and were requeued, by kind", m.reconcile_errors.clone());
        r.register("runs_in_backoff", "Runs whose last reconcile failed, waiting out their backoff", m.runs_in_backoff.clone());
        r.register("leader", "Whether this replica holds the leader lease (1) or not (0)", m.leader.clone());
        r.register(
            "audit_events_written",
            "AuditEvents written, by action (Granted, Changed, Withdrawn, Expired, Extended)",
            m.audit_events.clone(),
        );
        r.register("audit_events_collected", "AuditEvents deleted by retention (age, count per run)", m.audit_collected.clone());
        r.register("audit_collection_errors", "Retention passes over AuditEvents that failed", m.audit_errors.clone());
        r.register(
            "podslice_writes",
            "PodSlice writes, by operation (create, update, delete) and result (ok, conflict, failed)",
            m.slice_writes.clone(),
        );
        r.register("podslices", "PodSlices the controller holds for the cluster", m.slices.clone());
        r.register("podslice_pods", "Pods the PodSlices show", m.slice_pods.clone());
        r.register(
            "podslice_pods_left_out",
            "Pods left out of the PodSlices because their Pod object could not be read (each logged by name)",
            m.slice_pods_left_out.clone(),
        );
        Self { registry: root, ..m }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        crate::process::encode(&self.registry)
    }

    pub fn applied(&self, result: ApplyResult) {
        self.applied.get_or_create(&label("result", result.as_str())).inc();
        if result == ApplyResult::Recreated {
            self.withdrawn.inc();
        }
    }

    pub fn audited(&self, action: &str) {
        self.audit_events.get_or_create(&label("action", action)).inc();
    }

    pub fn audit_collected(&self, n: usize) {
        self.audit_collected.inc_by(n as u64);
    }

    pub fn audit_collection_failed(&self) {
        self.audit_errors.inc();
    }

    pub fn deleted(&self) {
        self.deleted.inc();
    }

    pub fn enforcement(&self, enabled: bool) {
        self.enforcement.set(i64::from(enabled));
    }

    pub fn reconciled(&self, kind: &str, seconds: f64) {
        self.reconcile_duration.get_or_create(&label("kind", kind)).observe(seconds);
    }

    pub fn reconcile_error(&self, kind: &str) {
        self.reconcile_errors.get_or_create(&label("kind", kind)).inc();
    }

    pub fn runs_in_backoff(&self, runs: usize) {
        self.runs_in_backoff.set(i64::try_from(runs).unwrap_or(i64::MAX));
    }

    /// `runs_in_backoff` (for tests and diagnostics).
    pub fn runs_in_backoff_count(&self) -> i64 {
        self.runs_in_backoff.get()
    }

    /// One PodSlice write: `op` create, update or delete; `result` ok, conflict or failed.
    pub fn slice_write(&self, op: &str, result: &str) {
        self.slice_writes.get_or_create(&vec![("op".to_string(), op.to_string()), ("result".to_string(), result.to_string())]).inc();
    }

    /// `podslice_writes_total{op,result}` (for tests and diagnostics).
    pub fn slice_write_count(&self, op: &str, result: &str) -> u64 {
        self.slice_writes.get_or_create(&vec![("op".to_string(), op.to_string()), ("result".to_string(), result.to_string())]).get()
    }

    /// The PodSlices held, the pods they show and the pods left out.
    pub fn slice_totals(&self, slices: usize, pods: usize, left_out: usize) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.slices.set(n(slices));
        self.slice_pods.set(n(pods));
        self.slice_pods_left_out.set(n(left_out));
    }

    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// `policies_applied_total{result}` (for tests and diagnostics).
    pub fn applied_count(&self, result: ApplyResult) -> u64 {
        self.applied.get_or_create(&label("result", result.as_str())).get()
    }

    /// `policies_withdrawn_total`.
    pub fn withdrawn_count(&self) -> u64 {
        self.withdrawn.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_metric() {
        let m = Metrics::new();
        m.applied(ApplyResult::Created);
        m.applied(ApplyResult::Recreated);
        m.applied(ApplyResult::Failed);
        m.enforcement(true);
        m.reconciled("Run", 0.01);
        m.reconcile_error("Run");
        m.leader(true);
        m.deleted();
        m.runs_in_backoff(2);
        let text = m.encode();
        for name in [
            "flock_controller_policies_applied_total{result=\"created\"} 1",
            "flock_controller_policies_applied_total{result=\"recreated\"} 1",
            "flock_controller_policies_applied_total{result=\"failed\"} 1",
            "flock_controller_policies_withdrawn_total 1",
            "flock_controller_policies_deleted_total 1",
            "flock_controller_enforcement_enabled 1",
            "flock_controller_reconcile_duration_seconds_count{kind=\"Run\"} 1",
            "flock_controller_reconcile_errors_total{kind=\"Run\"} 1",
            "flock_controller_runs_in_backoff 2",
            "flock_controller_leader 1",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        let info = format!("flock_build_info{{version=\"{}\",commit=\"{}\"}} 1", crate::process::VERSION, crate::process::COMMIT);
        assert!(text.contains(&info), "{info} missing in\n{text}");
        assert_eq!(m.withdrawn_count(), 1);
    }
}
