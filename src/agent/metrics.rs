//! The Prometheus metrics operators watch (`/metrics`): sync durations and failures, the
//! last successful sync, event-to-enforced latency, what is tracked, the ruleset's size,
//! the watches' state, reconnects and relists, API probes, CNI requests, coalesced events,
//! drift repairs, denied packets, revoked connections, this node's FlockNode writes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::process::{MetricLabels as Labels, metric_label as label};

/// The labels of the logged-packet counters (no pod label: its size does not grow with pods).
fn namespace_direction(namespace: &str, direction: &str) -> Labels {
    vec![("namespace".to_string(), namespace.to_string()), ("direction".to_string(), direction.to_string())]
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// All of flock-agent's metrics.
pub struct Metrics {
    registry: Registry,
    sync_duration: Family<Labels, Histogram, fn() -> Histogram>,
    sync_failures: Family<Labels, Counter>,
    last_success: Gauge<f64, std::sync::atomic::AtomicU64>,
    enforce_latency: Family<Labels, Histogram, fn() -> Histogram>,
    pods: Gauge,
    policies: Gauge,
    cluster_policies: Gauge,
    endpoints: Gauge,
    set_elements: Gauge,
    rules: Gauge,
    watch_connected: Family<Labels, Gauge>,
    watch_reconnects: Family<Labels, Counter>,
    watch_errors: Family<Labels, Counter>,
    watch_relists: Family<Labels, Counter>,
    api_probes: Family<Labels, Counter>,
    api_health: Family<Labels, Gauge>,
    resource_served: Family<Labels, Gauge>,
    slice_writer: Gauge,
    cni_requests: Family<Labels, Counter>,
    cni_in_flight: Gauge,
    coalesced: Counter,
    drift_repairs: Counter,
    translations: Family<Labels, Counter>,
    translation_disagreements: Counter,
    policy_problems: Gauge,
    policy_problems_cluster: Gauge,
    policy_reporter: Gauge,
    policy_event_requests: Family<Labels, Counter>,
    cluster_policies_enforced: Family<Labels, Gauge>,
    policy_status_requests: Family<Labels, Counter>,
    denied_packets: Family<Labels, Counter>,
    audit_denials: Family<Labels, Counter>,
    allowed_logged: Family<Labels, Counter>,
    denial_records_lost: Counter,
    denial_records_unreadable: Counter,
    revoked: Family<Labels, Counter>,
    revocation_sweeps: Family<Labels, Counter>,
    revocation_sweep_duration: Histogram,
    connections_listed: Gauge,
    node_status_writes: Family<Labels, Counter>,
    node_status_last_write: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The DNS proxy's counters (read into the families below when scraped).
    dns: std::sync::Arc<crate::dns_proxy::proxy::ProxyStats>,
    dns_queries: Counter,
    dns_answers: Family<Labels, Counter>,
    dns_refused: Family<Labels, Counter>,
    dns_learned_addresses: Family<Labels, Counter>,
    dns_learned_evictions: Counter,
    dns_learned_held: Gauge,
}

fn duration_histogram() -> Histogram {
    // 1 ms … ~33 s
    crate::process::duration_histogram(16)
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
        let mut r = Registry::with_prefix("flock");
        let m = Self {
            sync_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            sync_failures: Family::default(),
            last_success: Gauge::default(),
            enforce_latency: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            pods: Gauge::default(),
            policies: Gauge::default(),
            cluster_policies: Gauge::default(),
            endpoints: Gauge::default(),
            set_elements: Gauge::default(),
            rules: Gauge::default(),
            watch_connected: Family::default(),
            watch_reconnects: Family::default(),
            watch_errors: Family::default(),
            watch_relists: Family::default(),
            api_probes: Family::default(),
            api_health: Family::default(),
            resource_served: Family::default(),
            slice_writer: Gauge::default(),
            cni_requests: Family::default(),
            cni_in_flight: Gauge::default(),
            coalesced: Counter::default(),
            drift_repairs: Counter::default(),
            translations: Family::default(),
            translation_disagreements: Counter::default(),
            policy_problems: Gauge::default(),
            policy_problems_cluster: Gauge::default(),
            policy_reporter: Gauge::default(),
            policy_event_requests: Family::default(),
            cluster_policies_enforced: Family::default(),
            policy_status_requests: Family::default(),
            denied_packets: Family::default(),
            audit_denials: Family::default(),
            allowed_logged: Family::default(),
            denial_records_lost: Counter::default(),
            denial_records_unreadable: Counter::default(),
            revoked: Family::default(),
            revocation_sweeps: Family::default(),
            revocation_sweep_duration: duration_histogram(),
            connections_listed: Gauge::default(),
            node_status_writes: Family::default(),
            node_status_last_write: Gauge::default(),
            dns: std::sync::Arc::default(),
            dns_queries: Counter::default(),
            dns_answers: Family::default(),
            dns_refused: Family::default(),
            dns_learned_addresses: Family::default(),
            dns_learned_evictions: Counter::default(),
            dns_learned_held: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "sync_duration_seconds",
            "Duration of a sync, by outcome (applied: a transaction was committed; unchanged: no-op)",
            m.sync_duration.clone(),
        );
        r.register("sync_failures", "Failed syncs, by reason", m.sync_failures.clone());
        r.register("last_successful_sync_timestamp_seconds", "Unix time of the last committed sync", m.last_success.clone());
        r.register(
            "event_to_enforced_seconds",
            "From a change (cluster event or CNI ADD) to the committed sync that enforces it",
            m.enforce_latency.clone(),
        );
        r.register("pods_tracked", "Pods in the snapshot (cluster-wide)", m.pods.clone());
        r.register("policies_tracked", "NetworkPolicies in the snapshot", m.policies.clone());
        r.register("cluster_policies_tracked", "ClusterNetworkPolicies in the snapshot", m.cluster_policies.clone());
        r.register("local_endpoints", "Pod attachments registered on this node", m.endpoints.clone());
        r.register(
            "translations",
            "Translations by mode: incremental (only what changed since the last one), full (start, relist, too many changes), check (the periodic full translation the incremental state is compared with)",
            m.translations.clone(),
        );
        r.register(
            "translation_disagreements",
            "Periodic checks whose full translation differed from the incremental state (each one logged and repaired from the full translation)",
            m.translation_disagreements.clone(),
        );
        r.register("ruleset_set_elements", "Set and map elements in table inet flock", m.set_elements.clone());
        r.register("ruleset_rules", "Rules in table inet flock", m.rules.clone());
        r.register("watch_connected", "Whether the watch of a resource is healthy (1) or failing (0)", m.watch_connected.clone());
        r.register("watch_reconnects", "Watches re-established after an error, by resource", m.watch_reconnects.clone());
        r.register("watch_errors", "Watch errors, by resource", m.watch_errors.clone());
        r.register(
            "watch_relists",
            "Complete lists of a resource swapped into the snapshot, by resource and reason (initial, expired, too_large, failing)",
            m.watch_relists.clone(),
        );
        r.register(
            "api_probes",
            "Requests to the API server's /version, made only while every watch is quiet, by result",
            m.api_probes.clone(),
        );
        r.register(
            "api_health_state",
            "API server health: 1 for the current state (Connected, Degraded, Disconnected)",
            m.api_health.clone(),
        );
        r.register(
            "api_resource_served",
            "Whether an optional resource (a CRD flock does not own: clusternetworkpolicies) is served, as discovery last said",
            m.resource_served.clone(),
        );
        r.register(
            "pod_slice_writer_up",
            "With --pod-source slices: whether flock-controller's leader Lease is held and renewed (1: PodSlices are being written) or not (0)",
            m.slice_writer.clone(),
        );
        r.register("cni_requests", "Requests from flock-cni, by verb and result", m.cni_requests.clone());
        r.register(
            "cni_requests_in_flight",
            "ADD, DEL and GC requests from flock-cni being served (revocation sweeps give way while any is)",
            m.cni_in_flight.clone(),
        );
        r.register("coalesced_events", "Changes folded into a sync started for an earlier change", m.coalesced.clone());
        r.register("drift_repairs", "Times the kernel's table differed from what was applied and was rewritten", m.drift_repairs.clone());
        r.register(
            "policy_problems",
            "Problems in NetworkPolicies that apply to this node's pods (not enforceable as written)",
            m.policy_problems.clone(),
        );
        r.register(
            "policy_problems_cluster",
            "Problems in all NetworkPolicies of the cluster (counted by every agent)",
            m.policy_problems_cluster.clone(),
        );
        r.register(
            "policy_reporter",
            "Whether this agent holds the reporter Lease and publishes the cluster's policy problems as Events",
            m.policy_reporter.clone(),
        );
        r.register(
            "policy_event_requests",
            "Requests about PolicyNotEnforceable Events, by verb and result",
            m.policy_event_requests.clone(),
        );
        r.register(
            "cluster_policies_enforced",
            "ClusterNetworkPolicies of the cluster by whether flock enforces them as written (enforced=\"true\") or not (counted by every agent)",
            m.cluster_policies_enforced.clone(),
        );
        r.register(
            "policy_status_requests",
            "Requests about flock's condition in ClusterNetworkPolicy status (get, apply), by verb and result",
            m.policy_status_requests.clone(),
        );
        r.register(
            "denied_packets",
            "Denied packets the kernel logged (rate-limited per pod and direction: a floor, not a count of drops), by namespace of the pod whose policy denied and direction (ingress, egress, spoofed-source, unknown-pod, revoked)",
            m.denied_packets.clone(),
        );
        r.register(
            "audit_denials",
            "Audit mode: packets the audited policies would deny (logged and accepted; rate-limited like denials), by namespace and direction",
            m.audit_denials.clone(),
        );
        r.register(
            "allowed_connections_logged",
            "New connections logged as allowed (namespaces annotated flock.dev/log-allowed; rate-limited per pod and direction), by namespace and direction",
            m.allowed_logged.clone(),
        );
        r.register(
            "denial_records_lost",
            "Times the kernel could not queue denial records to the agent (its socket was full): some denials went unlogged",
            m.denial_records_lost.clone(),
        );
        r.register("denial_records_unreadable", "Denial records the agent could not decode", m.denial_records_unreadable.clone());
        r.register(
            "revoked_connections",
            "Established connections cut because the policy in force denies them (conntrack entries deleted after a change), by namespace of the pod whose policy denies and direction",
            m.revoked.clone(),
        );
        r.register(
            "revocation_sweeps",
            "Passes over the node's conntrack table judging established connections against the policy in force, by result (ok, failed)",
            m.revocation_sweeps.clone(),
        );
        r.register(
            "revocation_sweep_duration_seconds",
            "Duration of a pass over the conntrack table: list, judge, delete",
            m.revocation_sweep_duration.clone(),
        );
        r.register(
            "conntrack_entries_listed",
            "Connections the node's conntrack table held at the last revocation sweep",
            m.connections_listed.clone(),
        );
        r.register(
            "node_status_writes",
            "Writes of this node's FlockNode status, by result (ok; failed: any request of the attempt failed, retried after a backoff)",
            m.node_status_writes.clone(),
        );
        r.register(
            "node_status_last_write_timestamp_seconds",
            "Unix time of the last successful write of this node's FlockNode status",
            m.node_status_last_write.clone(),
        );
        // Every reason a sync can fail, at zero from the start: a dashboard's rate() sees
        // the first failure, and the series exist before anything went wrong.
        for reason in ["nft_rejected", "nft_spawn", "netns", "nft_list", "panic"] {
            let _ = m.sync_failures.get_or_create(&label("reason", reason));
        }
        for result in ["ok", "failed"] {
            let _ = m.revocation_sweeps.get_or_create(&label("result", result));
            let _ = m.node_status_writes.get_or_create(&label("result", result));
        }
        r.register("dns_queries", "DNS queries the DNS proxy received from pods with domain rules", m.dns_queries.clone());
        r.register(
            "dns_answers",
            "DNS answers by what the proxy did: learned (addresses admitted first), unusable (teaching nothing: passed on unchanged), untrusted (passed on), learn_failed (SERVFAIL), upstream_failed (no answer in time), mismatched (not the answer to the proxy's query: another id, question or case; dropped), truncated (larger than a UDP answer may be: the pod got a truncated one)",
            m.dns_answers.clone(),
        );
        r.register(
            "dns_refused",
            "DNS queries and TCP connections the proxy refused: not_steered (not to port 53 of a trusted resolver), malformed (not a standard query with one question), pod_limit and node_limit (in flight or connections)",
            m.dns_refused.clone(),
        );
        r.register("dns_answer_held_seconds", "How long answers were held while their addresses were admitted", m.dns.held.clone());
        r.register(
            "dns_learned_addresses",
            "Addresses written into domain rules' sets, by rule (policy and rule index)",
            m.dns_learned_addresses.clone(),
        );
        r.register(
            "dns_learned_evictions",
            "Learned addresses removed before their TTL to keep a domain rule's set, or the node, within its bound (those that expire first go)",
            m.dns_learned_evictions.clone(),
        );
        r.register("dns_learned_held", "Learned addresses the domain rules' sets hold on this node", m.dns_learned_held.clone());
        crate::process::register_build_info(&mut r);
        Self { registry: r, ..m }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let d = &self.dns;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        self.dns_queries.inner().store(load(&d.queries), std::sync::atomic::Ordering::Relaxed);
        for (result, n) in [
            ("learned", &d.learned),
            ("unusable", &d.unusable),
            ("untrusted", &d.untrusted),
            ("learn_failed", &d.learn_failures),
            ("upstream_failed", &d.upstream_failures),
            ("mismatched", &d.mismatched),
            ("truncated", &d.truncated),
        ] {
            self.dns_answers.get_or_create(&label("result", result)).inner().store(load(n), std::sync::atomic::Ordering::Relaxed);
        }
        for why in crate::dns_proxy::proxy::RefusedBy::ALL {
            self.dns_refused
                .get_or_create(&label("reason", why.as_str()))
                .inner()
                .store(d.refused(why), std::sync::atomic::Ordering::Relaxed);
        }
        crate::process::encode(&self.registry)
    }

    /// The DNS proxy's counters, for the proxy.
    pub(crate) fn dns_stats(&self) -> std::sync::Arc<crate::dns_proxy::proxy::ProxyStats> {
        self.dns.clone()
    }

    /// How many CNI requests that change the endpoints are being served.
    pub fn cni_in_flight(&self, n: usize) {
        self.cni_in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn sync(&self, applied: bool, seconds: f64) {
        self.sync_duration.get_or_create(&label("outcome", if applied { "applied" } else { "unchanged" })).observe(seconds);
        self.last_success.set(unix_now());
    }

    /// One attempt to write this node's FlockNode status.
    pub fn node_status_write(&self, ok: bool) {
        self.node_status_writes.get_or_create(&label("result", if ok { "ok" } else { "failed" })).inc();
        if ok {
            self.node_status_last_write.set(unix_now());
        }
    }

    pub fn sync_failed(&self, reason: &str) {
        self.sync_failures.get_or_create(&label("reason", reason)).inc();
    }

    pub fn enforced(&self, trigger: &str, seconds: f64) {
        self.enforce_latency.get_or_create(&label("trigger", trigger)).observe(seconds);
    }

    pub fn tracked(&self, pods: usize, policies: usize, endpoints: usize) {
        self.pods.set(i64::try_from(pods).unwrap_or(i64::MAX));
        self.policies.set(i64::try_from(policies).unwrap_or(i64::MAX));
        self.endpoints.set(i64::try_from(endpoints).unwrap_or(i64::MAX));
    }

    pub fn cluster_policies_tracked(&self, n: usize) {
        self.cluster_policies.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn ruleset(&self, rules: usize, elements: usize) {
        self.rules.set(i64::try_from(rules).unwrap_or(i64::MAX));
        self.set_elements.set(i64::try_from(elements).unwrap_or(i64::MAX));
    }

    pub fn watch(&self, resource: &str, connected: bool) {
        self.watch_connected.get_or_create(&label("resource", resource)).set(i64::from(connected));
    }

    pub fn watch_error(&self, resource: &str) {
        self.watch_errors.get_or_create(&label("resource", resource)).inc();
    }

    pub fn watch_reconnected(&self, resource: &str) {
        self.watch_reconnects.get_or_create(&label("resource", resource)).inc();
    }

    pub fn watch_relisted(&self, resource: &str, reason: &str) {
        self.watch_relists
            .get_or_create(&vec![("resource".to_string(), resource.to_string()), ("reason".to_string(), reason.to_string())])
            .inc();
    }

    pub fn api_probe(&self, ok: bool) {
        self.api_probes.get_or_create(&label("result", if ok { "ok" } else { "failed" })).inc();
    }

    pub fn health(&self, state: &str) {
        for s in ["Connected", "Degraded", "Disconnected"] {
            self.api_health.get_or_create(&label("state", s)).set(i64::from(s == state));
        }
    }

    pub fn resource_served(&self, resource: &str, served: bool) {
        self.resource_served.get_or_create(&label("resource", resource)).set(i64::from(served));
    }

    pub fn denied(&self, namespace: &str, direction: &str) {
        self.denied_packets.get_or_create(&namespace_direction(namespace, direction)).inc();
    }

    pub fn audit_denied(&self, namespace: &str, direction: &str) {
        self.audit_denials.get_or_create(&namespace_direction(namespace, direction)).inc();
    }

    pub fn allowed_logged(&self, namespace: &str, direction: &str) {
        self.allowed_logged.get_or_create(&namespace_direction(namespace, direction)).inc();
    }

    /// One revocation sweep: `Some((listed, seconds))` when it ran to the end.
    pub fn revocation_sweep(&self, done: Option<(usize, f64)>) {
        self.revocation_sweeps.get_or_create(&label("result", if done.is_some() { "ok" } else { "failed" })).inc();
        if let Some((listed, seconds)) = done {
            self.connections_listed.set(i64::try_from(listed).unwrap_or(i64::MAX));
            self.revocation_sweep_duration.observe(seconds);
        }
    }

    pub fn revoked(&self, namespace: &str, direction: &str) {
        self.revoked.get_or_create(&namespace_direction(namespace, direction)).inc();
    }

    pub fn denial_records_lost(&self) {
        self.denial_records_lost.inc();
    }

    pub fn denial_record_unreadable(&self) {
        self.denial_records_unreadable.inc();
    }

    pub fn cni(&self, verb: &str, ok: bool) {
        self.cni_requests
            .get_or_create(&vec![
                ("verb".to_string(), verb.to_string()),
                ("result".to_string(), if ok { "ok" } else { "refused" }.to_string()),
            ])
            .inc();
    }

    pub fn coalesced(&self, n: u64) {
        self.coalesced.inc_by(n);
    }

    pub fn drift_repaired(&self) {
        self.drift_repairs.inc();
    }

    pub fn translated(&self, mode: &str) {
        self.translations.get_or_create(&label("mode", mode)).inc();
    }

    pub fn translation_disagreed(&self) {
        self.translation_disagreements.inc();
    }

    pub fn problems(&self, n: usize) {
        self.policy_problems.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn cluster_problems(&self, n: usize) {
        self.policy_problems_cluster.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn reporter(&self, holding: bool) {
        self.policy_reporter.set(i64::from(holding));
    }

    /// How many ClusterNetworkPolicies are enforced as written, and how many are not.
    pub fn cluster_policies_enforced(&self, enforced: usize, not_enforced: usize) {
        for (v, n) in [("true", enforced), ("false", not_enforced)] {
            self.cluster_policies_enforced.get_or_create(&label("enforced", v)).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn status_request(&self, verb: &str, ok: bool) {
        self.policy_status_requests
            .get_or_create(&vec![
                ("verb".to_string(), verb.to_string()),
                ("result".to_string(), if ok { "ok" } else { "failed" }.to_string()),
            ])
            .inc();
    }

    pub fn event_request(&self, verb: &str, ok: bool) {
        self.policy_event_requests
            .get_or_create(&vec![
                ("verb".to_string(), verb.to_string()),
                ("result".to_string(), if ok { "ok" } else { "failed" }.to_string()),
            ])
            .inc();
    }
}

/// The informers' counts go to the agent's metrics.
impl crate::source::kube::SourceMetrics for Metrics {
    fn watch(&self, resource: &str, connected: bool) {
        Metrics::watch(self, resource, connected);
    }
    fn watch_error(&self, resource: &str) {
        Metrics::watch_error(self, resource);
    }
    fn watch_reconnected(&self, resource: &str) {
        Metrics::watch_reconnected(self, resource);
    }
    fn watch_relisted(&self, resource: &str, reason: &str) {
        Metrics::watch_relisted(self, resource, reason);
    }
    fn api_probe(&self, ok: bool) {
        Metrics::api_probe(self, ok);
    }
    fn health(&self, state: &str) {
        Metrics::health(self, state);
    }
    fn resource_served(&self, resource: &str, served: bool) {
        Metrics::resource_served(self, resource, served);
    }

    fn pod_slice_writer(&self, up: bool) {
        self.slice_writer.set(i64::from(up));
    }
}

/// The DNS proxy's learner counts what it learns and evicts here.
impl crate::dns_proxy::learner::LearnedStats for Metrics {
    fn learned(&self, rule: &str, addresses: u64) {
        self.dns_learned_addresses.get_or_create(&label("rule", rule)).inc_by(addresses);
    }

    fn evicted(&self, evicted: u64, held: i64) {
        self.dns_learned_evictions.inc_by(evicted);
        self.dns_learned_held.set(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_metric() {
        let m = Metrics::new();
        m.sync(true, 0.01);
        m.sync_failed("nft_rejected");
        m.enforced("source", 0.02);
        m.tracked(3, 2, 1);
        m.watch("pods", true);
        m.health("Connected");
        m.cni("add", true);
        m.coalesced(4);
        m.watch_relisted("networkpolicies", "too_large");
        m.api_probe(false);
        m.resource_served("clusternetworkpolicies", false);
        m.cluster_policies_tracked(2);
        m.cluster_policies_enforced(1, 1);
        m.node_status_write(true);
        let text = m.encode();
        for name in [
            "flock_sync_duration_seconds_bucket",
            "flock_sync_failures_total{reason=\"nft_rejected\"} 1",
            "flock_last_successful_sync_timestamp_seconds",
            "flock_event_to_enforced_seconds_count{trigger=\"source\"} 1",
            "flock_pods_tracked 3",
            "flock_watch_connected{resource=\"pods\"} 1",
            "flock_api_health_state{state=\"Connected\"} 1",
            "flock_api_health_state{state=\"Degraded\"} 0",
            "flock_cni_requests_total{verb=\"add\",result=\"ok\"} 1",
            "flock_coalesced_events_total 4",
            "flock_watch_relists_total{resource=\"networkpolicies\",reason=\"too_large\"} 1",
            "flock_api_probes_total{result=\"failed\"} 1",
            "flock_api_resource_served{resource=\"clusternetworkpolicies\"} 0",
            "flock_cluster_policies_tracked 2",
            "flock_cluster_policies_enforced{enforced=\"false\"} 1",
            "flock_build_info{version=",
            "flock_node_status_writes_total{result=\"ok\"} 1",
            "flock_node_status_writes_total{result=\"failed\"} 0",
            "flock_node_status_last_write_timestamp_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            assert!(line.starts_with("flock_"), "a metric without the flock_ prefix: {line}");
        }
    }
}
