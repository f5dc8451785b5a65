//! The sync loop's translate and render: incremental from one sync to the next
//! ([`translate::Incremental`], [`RenderCache`]), in full when it cannot be (the first sync,
//! a relist, more changes than the source's journal keeps), and checked against a full
//! translation on the periodic tick: a disagreement is counted, logged with what differs,
//! and repaired by starting again from the full translation (level-triggered stays the
//! truth).

use crate::model::{Change, LocalEndpoint, Snapshot};
use crate::render::{self, RenderCache, RenderOptions, Ruleset};
use crate::translate::{self, Incremental, NodePolicy, PolicyProblem};

/// More changes than this since the last sync: a full translation is about as fast.
const MAX_INCREMENTAL_CHANGES: usize = 4096;

/// How a sync translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Full,
    Incremental,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Incremental => "incremental",
        }
    }
}

/// What a sync's translation gives the applier and the reports.
pub(crate) struct Translated {
    pub(crate) ruleset: Ruleset,
    pub(crate) problems: Vec<PolicyProblem>,
    /// Addresses of nodes the overlay guard does not trust (sorted).
    pub(crate) overlay_problems: Vec<String>,
    pub(crate) mode: Mode,
    /// The periodic check ran (a full translation compared with the incremental state).
    pub(crate) checked: bool,
    /// It disagreed (and the full translation was used).
    pub(crate) disagreed: Option<String>,
    /// What denies each endpoint (for reading denial records).
    pub(crate) deniers: crate::nflog::denial::Endpoints,
}

struct State {
    translation: Incremental,
    cache: RenderCache,
    /// The source version translated.
    version: u64,
}

/// The translation kept from one sync to the next.
pub(crate) struct Translation {
    options: translate::Options,
    render: RenderOptions,
    state: Option<State>,
}

impl Translation {
    pub(crate) fn new(options: translate::Options, render: RenderOptions) -> Self {
        Self { options, render, state: None }
    }

    /// The translation kept, shared (`None`: none yet).
    pub(crate) fn shared_policy(&self) -> Option<std::sync::Arc<NodePolicy>> {
        self.state.as_ref().map(|s| s.translation.shared_policy())
    }

    /// The source version the kept translation is of (`None`: none kept).
    pub(crate) fn version(&self) -> Option<u64> {
        self.state.as_ref().map(|s| s.version)
    }

    /// Translates and renders `snapshot` (source version `version`) for `endpoints`.
    /// `changes`: every object changed since [`Self::version`] (`None`: unknown, translate
    /// in full). `check`: also translate in full and compare.
    pub(crate) fn sync(
        &mut self,
        snapshot: &Snapshot,
        version: u64,
        endpoints: &[LocalEndpoint],
        changes: Option<&[Change]>,
        check: bool,
    ) -> Translated {
        let changes = changes.filter(|c| c.len() <= MAX_INCREMENTAL_CHANGES);
        let (mut state, mode) = match (self.state.take(), changes) {
            (Some(mut s), Some(changes)) => {
                s.translation.update(snapshot, endpoints, changes);
                s.version = version;
                (s, Mode::Incremental)
            }
            _ => (self.fresh(snapshot, version, endpoints), Mode::Full),
        };
        let mut ruleset = state.cache.render(state.translation.policy(), state.translation.changed());
        let mut disagreed = None;
        let checked = check && mode == Mode::Incremental;
        if checked {
            let full = translate::translate(snapshot, endpoints, &self.options);
            let full_ruleset = render::render_with(&full, &self.render);
            let difference = difference(state.translation.policy(), &full)
                .or_else(|| (full_ruleset != ruleset).then(|| ruleset_difference(&ruleset, &full_ruleset)));
            if let Some(d) = difference {
                tracing::error!(difference = %d, "the incremental translation disagrees with a full one; using the full one");
                disagreed = Some(d);
                state = self.fresh(snapshot, version, endpoints);
                ruleset = full_ruleset;
            }
        }
        let problems = state.translation.policy().problems.clone();
        let overlay_problems = state.translation.policy().overlay.as_ref().map(|o| o.problems.clone()).unwrap_or_default();
        let deniers = crate::nflog::denial::Endpoints::of(state.translation.policy());
        self.state = Some(state);
        Translated { ruleset, problems, overlay_problems, mode, checked, disagreed, deniers }
    }

    fn fresh(&self, snapshot: &Snapshot, version: u64, endpoints: &[LocalEndpoint]) -> State {
        let translation = Incremental::new(snapshot, endpoints, &self.options);
        let mut cache = RenderCache::new(self.render.clone());
        // Rendered once so the cache holds this translation's pieces.
        cache.render(translation.policy(), translation.changed());
        State { translation, cache, version }
    }
}

/// The first difference between two translations, by name (`None`: equal).
pub(crate) fn difference(a: &NodePolicy, b: &NodePolicy) -> Option<String> {
    if a == b {
        return None;
    }
    let ifaces = |np: &NodePolicy| np.endpoints.iter().map(|e| e.interface.clone()).collect::<Vec<_>>();
    if ifaces(a) != ifaces(b) {
        return Some(format!("endpoints {:?} vs {:?}", ifaces(a), ifaces(b)));
    }
    for (x, y) in a.endpoints.iter().zip(&b.endpoints) {
        if x != y {
            return Some(format!("the policy of endpoint {} (pod {})", x.interface, x.pod));
        }
    }
    for (def, set) in &a.peer_sets {
        if b.peer_sets.get(def) != Some(set) {
            return Some(format!("peer set {def}"));
        }
    }
    if let Some(def) = b.peer_sets.keys().find(|d| !a.peer_sets.contains_key(*d)) {
        return Some(format!("peer set {def} (missing)"));
    }
    for (def, set) in &a.port_sets {
        if b.port_sets.get(def) != Some(set) {
            return Some(format!("named-port set {def}"));
        }
    }
    if let Some(def) = b.port_sets.keys().find(|d| !a.port_sets.contains_key(*d)) {
        return Some(format!("named-port set {def} (missing)"));
    }
    Some("policy problems".to_string())
}

/// The first object two rulesets differ in.
fn ruleset_difference(a: &Ruleset, b: &Ruleset) -> String {
    for (x, y) in a.objects.iter().zip(&b.objects) {
        if x != y {
            return format!("rendered {} {}", x.keyword(), x.name());
        }
    }
    format!("rendered objects: {} vs {}", a.objects.len(), b.objects.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    /// The base cluster (x/y/z × a/b/c on two nodes) with x/a open only to x/b, recording
    /// its changes.
    fn snapshot() -> Snapshot {
        let mut s = testkit::base_cluster();
        for p in testkit::policies(
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]",
        ) {
            s.upsert_policy(p);
        }
        s.record_changes();
        s
    }

    /// A copy of x/b on another address: a new peer of x/a's policy.
    fn another_b(s: &Snapshot) -> crate::model::Pod {
        let b = s.pod_by_name(&testkit::pod_ref("x/b")).cloned().expect("x/b");
        crate::model::Pod { name: "b2".into(), uid: "uid-b2".into(), ips: vec!["198.18.250.2".parse().expect("address")], ..b }
    }

    fn node_of_a(s: &Snapshot) -> Vec<LocalEndpoint> {
        let a = s.pod_by_name(&testkit::pod_ref("x/a")).expect("x/a");
        s.derived_endpoints(a.node.as_deref().expect("x/a has a node"))
    }

    #[test]
    fn incremental_until_the_journal_is_lost_then_full_and_the_check_agrees() {
        let mut s = snapshot();
        let endpoints = node_of_a(&s);
        let mut t = Translation::new(translate::Options::default(), RenderOptions::DEFAULT);
        let first = t.sync(&s, 1, &endpoints, Some(&[]), false);
        assert_eq!(first.mode, Mode::Full);

        let b2 = another_b(&s);
        s.upsert_pod(b2);
        let changes = s.take_changes();
        assert_eq!(changes.len(), 1);
        let second = t.sync(&s, 2, &endpoints, Some(&changes), true);
        assert_eq!(second.mode, Mode::Incremental);
        assert!(second.checked);
        assert_eq!(second.disagreed, None);
        assert!(second.ruleset.to_text().contains("198.18.250.2"));
        assert_eq!(t.version(), Some(2));

        s.remove_pod("uid-b2");
        s.take_changes();
        let third = t.sync(&s, 3, &endpoints, None, false);
        assert_eq!(third.mode, Mode::Full);
        assert!(!third.ruleset.to_text().contains("198.18.250.2"));
    }

    #[test]
    fn a_missed_change_is_found_by_the_check_and_repaired() {
        let mut s = snapshot();
        let endpoints = node_of_a(&s);
        let mut t = Translation::new(translate::Options::default(), RenderOptions::DEFAULT);
        t.sync(&s, 1, &endpoints, Some(&[]), false);
        let b2 = another_b(&s);
        s.upsert_pod(b2);
        // The change is withheld: the incremental state misses the new peer.
        let missed = t.sync(&s, 2, &endpoints, Some(&[]), false);
        assert!(!missed.ruleset.to_text().contains("198.18.250.2"));
        let checked = t.sync(&s, 2, &endpoints, Some(&[]), true);
        let d = checked.disagreed.expect("the check must find the missed pod");
        assert!(d.contains("peer set"), "{d}");
        assert!(checked.ruleset.to_text().contains("198.18.250.2"));
        assert_eq!(checked.ruleset, render::render(&translate::translate(&s, &endpoints, &translate::Options::default())));
    }
}
