//! Pods from PodSlices ([`PodSource::Slices`](super::PodSource)): the cluster's pods as
//! flock-controller batches them, and this node's own pods from a field-selected Pod watch,
//! merged into the snapshot's one set of pods.
//!
//! - A pod of another node is what a slice shows of it ([`crate::slices::decode`]: an entry
//!   that does not parse is left out and logged by name — no peer).
//! - A pod of this node is what the local watch says (the authority for this node: its
//!   labels reach its own chains at once); a slice entry for it counts only as publication.
//!   Until some slice shows its uid it is [`unpublished`](crate::model::Pod::unpublished):
//!   its own chains follow it, no peer set holds it (fail closed). A slice entry naming this
//!   node for a pod the local watch does not have is ignored.
//! - An address handed from one pod to another (a new uid) is in the new pod's sets only
//!   once a slice names it; until the old owner's slice drops it, the two contest the
//!   address and the translator's ownership rule applies (the newer owns it).
//!
//! Only membership is kept here (which slices show which uid, which uids are local): the
//! pods themselves live in the snapshot alone.
//!
//! The writer's absence is reported ([`watch_writer`]): nothing in a slice says it is stale,
//! so the agent reads flock-controller's leader Lease; held and renewed, the slices are
//! being written (`flock_pod_slice_writer_up` 1); missing, without a holder or not renewed
//! for its duration (by the agent's own clock, between two reads), a warning names the
//! Lease and the gauge is 0. The last slices stay in force meanwhile: other nodes' pods as
//! they last showed them, new pods in no peer set.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::GetParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use super::health::unit_jitter;
use super::reflect::Kind;
use super::{Key, Object, SourceMetrics, WriterLease};
use crate::crd::PodSlice;
use crate::model::{Pod, Snapshot};

/// A PodSlice to its pods; an entry that cannot be read is logged and left out, so the
/// conversion itself never fails.
pub(super) const POD_SLICES: Kind<PodSlice> = Kind {
    convert: |s| {
        let name = s.metadata.name.clone().unwrap_or_default();
        let (pods, problems) = crate::slices::decode(&name, &s.spec);
        for p in &problems {
            tracing::warn!(error = %p, "a PodSlice entry that cannot be read is left out (no peer)");
        }
        Ok(Object::Slice(name, pods))
    },
    key: |s| Key::Slice(s.metadata.name.clone().unwrap_or_default()),
    drop_unreadable: true,
    optional: false,
};

/// Which slices show which pods, and which pods are this node's.
#[derive(Debug, Default)]
pub(super) struct PodMerge {
    node: String,
    /// Slice → the uids it shows.
    slices: BTreeMap<String, Vec<String>>,
    /// Uid → how many slices show it (one, but for a pod moving between slices; a slice
    /// shows a uid once: `decode` leaves out a second entry).
    shown: BTreeMap<String, u32>,
    /// This node's pods (the local watch's), by uid.
    local: BTreeSet<String>,
}

impl PodMerge {
    pub(super) fn new(node: &str) -> Self {
        Self { node: node.to_string(), ..Self::default() }
    }

    fn is_local(&self, pod: &Pod) -> bool {
        pod.node.as_deref() == Some(self.node.as_str())
    }

    /// Slice `name` now shows `pods` (`None`: deleted).
    pub(super) fn slice(&mut self, s: &mut Snapshot, name: &str, pods: Option<Vec<Pod>>) {
        let old = self.slices.remove(name).unwrap_or_default();
        let pods = pods.unwrap_or_default();
        let new: BTreeSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        for uid in old.iter().filter(|u| !new.contains(u.as_str())) {
            self.unshow(s, uid);
        }
        let old: BTreeSet<&str> = old.iter().map(String::as_str).collect();
        let mut uids = Vec::with_capacity(pods.len());
        for pod in pods {
            let added = !old.contains(pod.uid.as_str());
            uids.push(pod.uid.clone());
            self.show(s, pod, added);
        }
        if !uids.is_empty() {
            self.slices.insert(name.to_string(), uids);
        }
    }

    /// Every slice, from a relist.
    pub(super) fn slices_relisted(&mut self, s: &mut Snapshot, slices: Vec<(String, Vec<Pod>)>) {
        let listed: BTreeSet<&String> = slices.iter().map(|(n, _)| n).collect();
        let gone: Vec<String> = self.slices.keys().filter(|n| !listed.contains(n)).cloned().collect();
        for name in gone {
            self.slice(s, &name, None);
        }
        for (name, pods) in slices {
            self.slice(s, &name, Some(pods));
        }
    }

    /// `pod` as a slice shows it; `added`: that slice did not show it before.
    fn show(&mut self, s: &mut Snapshot, pod: Pod, added: bool) {
        let first = added && {
            let count = self.shown.entry(pod.uid.clone()).or_default();
            *count += 1;
            *count == 1
        };
        if self.is_local(&pod) {
            // Publication of a local pod: its data stay the local watch's.
            if first && self.local.contains(&pod.uid) {
                self.republish(s, &pod.uid, false);
            }
            return;
        }
        if s.pod(&pod.uid) != Some(&pod) {
            s.upsert_pod(pod);
        }
    }

    /// A slice no longer shows `uid`.
    fn unshow(&mut self, s: &mut Snapshot, uid: &str) {
        let Some(count) = self.shown.get_mut(uid) else { return };
        *count = count.saturating_sub(1);
        if *count > 0 {
            return;
        }
        self.shown.remove(uid);
        if self.local.contains(uid) {
            self.republish(s, uid, true);
        } else {
            s.remove_pod(uid);
        }
    }

    fn republish(&self, s: &mut Snapshot, uid: &str, unpublished: bool) {
        if let Some(p) = s.pod(uid).filter(|p| p.unpublished != unpublished) {
            let mut p = p.clone();
            p.unpublished = unpublished;
            s.upsert_pod(p);
        }
    }

    /// A pod of the local watch (this node's), or its deletion by uid.
    pub(super) fn local(&mut self, s: &mut Snapshot, pod: Result<Pod, String>) {
        match pod {
            Ok(mut p) => {
                p.unpublished = !self.shown.contains_key(&p.uid);
                self.local.insert(p.uid.clone());
                if s.pod(&p.uid) != Some(&p) {
                    s.upsert_pod(p);
                }
            }
            Err(uid) => {
                self.local.remove(&uid);
                // What a slice shows of this node's pods is never used: the local watch
                // is the authority here, and it says the pod is gone.
                s.remove_pod(&uid);
            }
        }
    }

    /// This node's pods, from a relist.
    pub(super) fn local_relisted(&mut self, s: &mut Snapshot, pods: Vec<Pod>) {
        let listed: BTreeSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        let gone: Vec<String> = self.local.iter().filter(|u| !listed.contains(u.as_str())).cloned().collect();
        for uid in gone {
            self.local(s, Err(uid));
        }
        for p in pods {
            self.local(s, Ok(p));
        }
    }
}

/// Whether the writer is there, from what its Lease said at `now`; updates `seen` (the
/// last resourceVersion and when it changed, by this clock).
fn writer_up(lease: Option<&Lease>, seen: &mut Option<(String, Instant)>, every: Duration, now: Instant) -> Result<(), String> {
    let Some(lease) = lease else { return Err("the Lease does not exist".into()) };
    let spec = lease.spec.as_ref();
    if spec.and_then(|s| s.holder_identity.as_deref()).is_none_or(str::is_empty) {
        return Err("the Lease has no holder".into());
    }
    let rv = lease.metadata.resource_version.clone().unwrap_or_default();
    match seen {
        Some((last, _)) if *last == rv => {}
        _ => *seen = Some((rv, now)),
    }
    let duration = Duration::from_secs(spec.and_then(|s| s.lease_duration_seconds).and_then(|d| u64::try_from(d).ok()).unwrap_or(15));
    let since = seen.as_ref().map_or(now, |(_, at)| *at);
    // A leader renews several times a lease duration: unchanged across more than one
    // read's interval plus that duration, it has stopped.
    let stale = every + every / 2 + duration;
    if now.saturating_duration_since(since) > stale {
        return Err(format!("the Lease was not renewed for {}s", now.saturating_duration_since(since).as_secs()));
    }
    Ok(())
}

/// Reads the writer's Lease until `stop`, reporting its presence.
pub(super) async fn watch_writer(
    client: Client,
    lease: WriterLease,
    seed: u64,
    metrics: Arc<dyn SourceMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let mut seen: Option<(String, Instant)> = None;
    let mut up: Option<bool> = None;
    let mut n = 0u64;
    loop {
        let read = match api.get_with(&lease.name, &GetParams::any()).await {
            Ok(l) => Some(Some(l)),
            Err(kube::Error::Api(s)) if s.code == 404 => Some(None),
            // The API's own health covers a failed read: the last verdict stands.
            Err(e) => {
                tracing::debug!(error = %e, "reading the PodSlice writer's Lease");
                None
            }
        };
        if let Some(l) = read {
            let verdict = writer_up(l.as_ref(), &mut seen, lease.every, Instant::now());
            let now_up = verdict.is_ok();
            metrics.pod_slice_writer(now_up);
            match (&verdict, up) {
                (Err(why), Some(true) | None) => tracing::warn!(
                    lease = %format!("{}/{}", lease.namespace, lease.name),
                    why = %why,
                    "PodSlices are not being written (is flock-controller running with --pod-slices?): other nodes' pods stay as the last slices show them, new pods are no peers until it is back (or run with --pod-source pods)"
                ),
                (Ok(()), Some(false)) => {
                    tracing::info!(lease = %format!("{}/{}", lease.namespace, lease.name), "the PodSlice writer is back")
                }
                _ => {}
            }
            up = Some(now_up);
        }
        n += 1;
        let wait = lease.every + lease.every.mul_f64(0.5 * unit_jitter(seed, n));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Labels, PodPhase};

    fn pod(name: &str, node: &str, ip: &str) -> Pod {
        let mut labels = Labels::new();
        labels.insert("app", name);
        Pod {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels,
            node: Some(node.into()),
            phase: PodPhase::Running,
            ips: vec![ip.parse().unwrap()],
            host_network: false,
            ports: vec![],
            created: None,
            unpublished: false,
        }
    }

    fn peers(s: &Snapshot) -> Vec<String> {
        let mut v: Vec<String> = s.pods().filter(|p| p.is_peer()).map(|p| p.name.clone()).collect();
        v.sort();
        v
    }

    /// Other nodes' pods come from the slices; this node's from its watch, peers only once a
    /// slice shows them, and gone when the watch says so whatever a slice still shows.
    #[test]
    fn local_pods_are_peers_once_published_and_the_local_watch_decides_them() {
        let mut s = Snapshot::new();
        let mut m = PodMerge::new("node-a");
        m.slice(&mut s, "shop-0", Some(vec![pod("remote", "node-b", "198.18.1.2"), pod("ghost", "node-a", "198.18.0.9")]));
        // ghost: a slice entry for this node the local watch does not have: ignored.
        assert_eq!(peers(&s), ["remote"]);
        assert!(s.pod("uid-ghost").is_none());

        let mut local = pod("local", "node-a", "198.18.0.2");
        local.labels.insert("fresh", "yes");
        m.local(&mut s, Ok(local.clone()));
        assert!(s.pod("uid-local").is_some_and(|p| p.unpublished), "a local pod no slice shows is no peer");
        assert_eq!(peers(&s), ["remote"]);

        // Published: the slice's (older) labels do not replace the local watch's.
        m.slice(&mut s, "shop-0", Some(vec![pod("remote", "node-b", "198.18.1.2"), pod("local", "node-a", "198.18.0.2")]));
        assert_eq!(peers(&s), ["local", "remote"]);
        assert_eq!(s.pod("uid-local").unwrap().labels.get("fresh"), Some("yes"));

        // Moved to another slice (added there first, then dropped here): published throughout.
        m.slice(&mut s, "shop-1", Some(vec![pod("local", "node-a", "198.18.0.2")]));
        m.slice(&mut s, "shop-0", Some(vec![pod("remote", "node-b", "198.18.1.2")]));
        assert_eq!(peers(&s), ["local", "remote"]);
        // Dropped by every slice: unpublished again.
        m.slice(&mut s, "shop-1", None);
        assert_eq!(peers(&s), ["remote"]);
        assert!(s.pod("uid-local").is_some());

        // Deleted by the local watch: gone, though a slice shows it again.
        m.slice(&mut s, "shop-1", Some(vec![pod("local", "node-a", "198.18.0.2")]));
        m.local(&mut s, Err("uid-local".into()));
        assert!(s.pod("uid-local").is_none());
        // A remote pod a slice drops is gone.
        m.slice(&mut s, "shop-0", Some(vec![]));
        assert!(s.pod("uid-remote").is_none());
    }

    /// The writer is there while its Lease is held and renewed; a Lease that stops changing
    /// for longer than a read's interval plus its duration, or has no holder, or is gone,
    /// says it is not.
    #[test]
    fn the_writer_is_told_absent_from_its_lease() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        let every = Duration::from_secs(30);
        let lease = |rv: &str, holder: Option<&str>| Lease {
            metadata: kube::api::ObjectMeta { resource_version: Some(rv.into()), ..Default::default() },
            spec: Some(LeaseSpec { holder_identity: holder.map(str::to_string), lease_duration_seconds: Some(15), ..Default::default() }),
        };
        let t0 = Instant::now();
        let mut seen = None;
        assert!(writer_up(Some(&lease("1", Some("a"))), &mut seen, every, t0).is_ok());
        assert!(writer_up(Some(&lease("9", Some("a"))), &mut seen, every, t0 + every).is_ok());
        // Unchanged for 45 s + 15 s: still up; longer, not.
        assert!(writer_up(Some(&lease("9", Some("a"))), &mut seen, every, t0 + every + Duration::from_secs(60)).is_ok());
        let stale = writer_up(Some(&lease("9", Some("a"))), &mut seen, every, t0 + every + Duration::from_secs(61));
        assert!(stale.unwrap_err().contains("not renewed"));
        assert!(writer_up(Some(&lease("10", Some("a"))), &mut seen, every, t0 + Duration::from_secs(200)).is_ok());
        assert_eq!(writer_up(Some(&lease("11", None)), &mut seen, every, t0), Err("the Lease has no holder".into()));
        assert_eq!(writer_up(None, &mut seen, every, t0), Err("the Lease does not exist".into()));
    }

    /// A relist of either source replaces what it said before.
    #[test]
    fn relists_replace_their_source() {
        let mut s = Snapshot::new();
        let mut m = PodMerge::new("node-a");
        m.slice(&mut s, "shop-0", Some(vec![pod("a", "node-b", "198.18.1.2")]));
        m.slice(&mut s, "shop-1", Some(vec![pod("b", "node-b", "198.18.1.3"), pod("l", "node-a", "198.18.0.2")]));
        m.local(&mut s, Ok(pod("l", "node-a", "198.18.0.2")));
        m.local(&mut s, Ok(pod("m", "node-a", "198.18.0.3")));
        assert_eq!(peers(&s), ["a", "b", "l"]);
        m.slices_relisted(&mut s, vec![("shop-1".into(), vec![pod("m", "node-a", "198.18.0.3")])]);
        assert_eq!(peers(&s), ["m"]);
        assert!(s.pod("uid-l").is_some_and(|p| p.unpublished));
        m.local_relisted(&mut s, vec![pod("l", "node-a", "198.18.0.2")]);
        assert_eq!(peers(&s), Vec::<String>::new());
        assert!(s.pod("uid-m").is_none() && s.pod("uid-l").is_some());
    }
}
