//! Applier tests over the in-memory backend: no-op de-duplication, stale objects, atomic
//! failure, drift detection and repair, base chain kept across updates.

use super::fake::FakeNft;
use super::*;
use crate::model::Snapshot;
use crate::render::{BASE_CHAIN, render};
use crate::testkit;
use crate::translate::{Options, translate};

fn ruleset(s: &Snapshot) -> Ruleset {
    render(&translate(s, &s.derived_endpoints("node-1"), &Options::default()))
}

fn with(policies: &str) -> Snapshot {
    let mut s = testkit::base_cluster();
    for p in testkit::policies(policies) {
        s.upsert_policy(p);
    }
    s
}

const DENY_X: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}";

#[test]
fn equal_render_is_a_noop() {
    let mut a = Applier::new(FakeNft::new());
    let rs = ruleset(&testkit::base_cluster());
    assert!(matches!(a.apply(&rs).unwrap(), Outcome::Applied { .. }));
    assert_eq!(a.apply(&rs).unwrap(), Outcome::Unchanged);
    assert_eq!(a.backend().transactions, 1);
}

#[test]
fn updates_delete_stale_objects_and_keep_the_base_chain() {
    let mut a = Applier::new(FakeNft::new());
    a.apply(&ruleset(&with(DENY_X))).unwrap();
    let handle = a.backend().table().unwrap().chains[BASE_CHAIN].handle;
    let before: Vec<String> = a.backend().table().unwrap().chains.keys().cloned().collect();
    assert!(before.iter().any(|c| c.starts_with("ingress-")));

    let out = a.apply(&ruleset(&testkit::base_cluster())).unwrap();
    assert!(matches!(out, Outcome::Applied { stale_deleted, .. } if stale_deleted >= 2), "{out:?}");
    let t = a.backend().table().unwrap();
    assert!(!t.chains.keys().any(|c| c.starts_with("ingress-")));
    assert_eq!(t.chains[BASE_CHAIN].handle, handle, "base chain was re-created");
    // The table now holds exactly the new render.
    assert_eq!(t.dump(), crate::nft::canonical(&ruleset(&testkit::base_cluster()).to_text()).unwrap());
}

#[test]
fn a_failed_transaction_changes_nothing_and_forces_a_full_sync() {
    let mut a = Applier::new(FakeNft::new());
    a.apply(&ruleset(&testkit::base_cluster())).unwrap();
    let before = a.backend().dump();
    a.backend_mut().fail_with = Some("injected".into());
    let err = a.apply(&ruleset(&with(DENY_X))).unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(a.backend().dump(), before);
    a.backend_mut().fail_with = None;
    // The next apply of the *old* render is not a no-op: after a failure nothing is assumed.
    assert!(matches!(a.apply(&ruleset(&testkit::base_cluster())).unwrap(), Outcome::Applied { .. }));
}

#[test]
fn drift_is_detected_and_repaired() {
    let mut a = Applier::new(FakeNft::new());
    assert_eq!(a.check_drift().unwrap(), Drift::NotApplied);
    let rs = ruleset(&with(DENY_X));
    a.apply(&rs).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // Someone flushes a policy chain and adds a rule to the base chain.
    let chain = rs.objects.iter().map(|o| o.name().to_string()).find(|n| n.starts_with("ingress-")).unwrap();
    a.backend_mut().state_mut().apply_script(&format!("flush chain inet flock {chain}\nadd rule inet flock forward accept")).unwrap();
    assert!(matches!(a.check_drift().unwrap(), Drift::Changed { .. }));
    a.invalidate();
    a.apply(&rs).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // Someone deletes the whole table.
    a.backend_mut().state_mut().apply_script("delete table inet flock").unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::Missing);
    a.invalidate();
    a.apply(&rs).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
}

#[test]
fn a_baseline_read_beside_the_applier_is_taken_only_for_the_commit_it_followed() {
    let mut a = Applier::new(FakeNft::new()).defer_baseline();
    assert!(a.baseline_reader().is_none(), "nothing applied, nothing to read");
    a.apply(&ruleset(&testkit::base_cluster())).unwrap();
    let (commit, mut reader) = a.baseline_reader().unwrap();
    let read = reader.read_state().unwrap();
    // Another transaction commits while the read was in flight: the read is stale.
    let rs = ruleset(&with(DENY_X));
    a.apply(&rs).unwrap();
    assert!(!a.accept_baseline(commit, read));
    assert!(a.needs_baseline());
    assert_eq!(a.check_drift().unwrap(), Drift::Unverified);
    let (commit, mut reader) = a.baseline_reader().unwrap();
    assert!(a.accept_baseline(commit, reader.read_state().unwrap()));
    assert!(!a.needs_baseline() && a.baseline_reader().is_none());
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
}

#[test]
fn conflicting_objects_are_rebuilt_in_one_transaction() {
    let mut a = Applier::new(FakeNft::new());
    let rs = ruleset(&testkit::base_cluster());
    a.apply(&rs).unwrap();
    // Another version left a set with flock's name but another type, and an unknown chain.
    a.backend_mut()
        .state_mut()
        .apply_script("flush chain inet flock from-pods\ndelete set inet flock pod-addrs-v4\nadd set inet flock pod-addrs-v4 { type ipv4_addr; }\nadd chain inet flock leftover")
        .unwrap();
    let base_handle = a.backend().table().unwrap().chains[BASE_CHAIN].handle;
    a.invalidate();
    a.apply(&rs).unwrap();
    let t = a.backend().table().unwrap();
    assert!(!t.chains.contains_key("leftover"));
    assert_eq!(t.chains[BASE_CHAIN].handle, base_handle);
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
}

#[test]
fn other_tables_are_never_touched() {
    let mut fake = FakeNft::new();
    fake.state_mut().apply_script("table ip kube-proxy {\n\tchain c {\n\t\tcounter\n\t}\n}\n").unwrap();
    let mut a = Applier::new(fake);
    a.apply(&ruleset(&with(DENY_X))).unwrap();
    a.apply(&ruleset(&testkit::base_cluster())).unwrap();
    let script = a.backend().last_script.clone().unwrap();
    assert!(script.lines().all(|l| !l.contains("kube-proxy")));
    assert!(a.backend().dump().contains("table ip kube-proxy"));
}

#[test]
fn check_validates_without_committing() {
    let mut a = Applier::new(FakeNft::new());
    a.check(&ruleset(&with(DENY_X))).unwrap();
    assert!(a.backend().table().is_none());
}

#[test]
fn a_restarted_applier_adopts_identical_kernel_content() {
    let mut a = Applier::new(FakeNft::new());
    let rs = ruleset(&with(DENY_X));
    a.apply(&rs).unwrap();
    // A new process: same kernel state, fresh applier.
    let fake = a.backend().clone();
    let mut b = Applier::new(fake);
    assert_eq!(b.apply(&rs).unwrap(), Outcome::Unchanged);
    assert_eq!(b.backend().transactions, 1);
    // Different content is applied as usual.
    assert!(matches!(b.apply(&ruleset(&testkit::base_cluster())).unwrap(), Outcome::Applied { .. }));
}

const ALLOW_MIX: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: mix, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
    - ipBlock: {cidr: 198.18.0.0/16, except: [198.18.1.0/24]}
    ports: [{port: 80}, {protocol: UDP, port: 81, endPort: 90}]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-y, namespace: y}
spec: {podSelector: {}, policyTypes: [Egress]}";

/// Snapshots that differ in every way a sync can: policies, peers, CIDRs, labels, pods.
fn variants() -> Vec<(&'static str, Snapshot)> {
    let base = testkit::base_cluster();
    let mut relabelled = with(ALLOW_MIX);
    // x/b stops being x/a's egress peer.
    let mut pod = relabelled.pods().find(|p| p.namespace == "x" && p.name == "b").unwrap().clone();
    pod.labels.insert("pod", "z");
    relabelled.upsert_pod(pod);
    let mut fewer = with(ALLOW_MIX);
    let gone = fewer.pods().find(|p| p.namespace == "y" && p.name == "c").unwrap().clone();
    fewer.remove_pod(&gone.uid);
    let mut other_cidr = with(ALLOW_MIX.replace("198.18.1.0/24", "198.18.2.0/23").as_str());
    other_cidr.upsert_policy(testkit::policies(DENY_X).remove(0));
    vec![
        ("base", base),
        ("deny-x", with(DENY_X)),
        ("mix", with(ALLOW_MIX)),
        ("mix-relabelled", relabelled),
        ("mix-fewer-pods", fewer),
        ("mix-other-cidr+deny-x", other_cidr),
    ]
}

#[test]
fn incremental_updates_reach_exactly_the_new_render() {
    let variants = variants();
    let renders: BTreeSet<String> = variants.iter().map(|(_, s)| ruleset(s).to_text()).collect();
    assert_eq!(renders.len(), variants.len(), "every variant renders differently");
    for (from_name, from) in &variants {
        for (to_name, to) in &variants {
            let mut a = Applier::new(FakeNft::new());
            a.apply(&ruleset(from)).unwrap();
            let next = ruleset(to);
            let out = a.apply(&next).unwrap();
            let ctx = format!("{from_name} → {to_name}");
            if from_name == to_name {
                assert_eq!(out, Outcome::Unchanged, "{ctx}");
                continue;
            }
            let script = a.backend().last_script.clone().unwrap();
            assert!(matches!(out, Outcome::Applied { incremental: true, .. }), "{ctx}: {out:?}");
            assert!(!script.starts_with("add table"), "{ctx}: took the full path:\n{script}");
            assert_eq!(a.backend().transactions, 2, "{ctx}");
            let t = a.backend().table().unwrap();
            assert_eq!(t.dump(), crate::nft::canonical(&next.to_text()).unwrap(), "{ctx}:\n{script}");
            assert_eq!(a.check_drift().unwrap(), Drift::InSync, "{ctx}");
        }
    }
}

#[test]
fn an_incremental_update_touches_only_what_changed() {
    let mut a = Applier::new(FakeNft::new());
    a.apply(&ruleset(&with(ALLOW_MIX))).unwrap();
    let mut s = with(ALLOW_MIX);
    // One more peer pod in y: only peer sets gain an element.
    let mut p = s.pods().find(|p| p.namespace == "y" && p.name == "a").unwrap().clone();
    p.uid = "uid-y-d".into();
    p.name = "d".into();
    p.ips = vec!["198.18.250.4".parse().unwrap()];
    s.upsert_pod(p);
    a.apply(&ruleset(&s)).unwrap();
    let script = a.backend().last_script.clone().unwrap();
    assert!(script.lines().all(|l| l.starts_with("add element")), "{script}");
    assert!(script.contains("198.18.250.4"), "{script}");
}

#[test]
fn a_changed_declaration_takes_the_full_path() {
    let prev = ruleset(&with(DENY_X));
    let mut next = prev.clone();
    next.comment.push_str(" (changed)");
    assert!(incremental(&prev, &next).is_none());
    let mut next = prev.clone();
    if let Some(Object::Set(s)) = next.objects.iter_mut().find(|o| matches!(o, Object::Set(_))) {
        s.comment.push('!');
    }
    assert!(incremental(&prev, &next).is_none());
}

#[test]
fn a_failed_incremental_transaction_falls_back_to_a_full_one() {
    let mut a = Applier::new(FakeNft::new());
    a.apply(&ruleset(&with(DENY_X))).unwrap();
    // Behind flock's back, a chain flock will flush is deleted: the incremental script fails.
    // (A pod's entry chain: only the dispatch map refers to it.)
    let chain = ruleset(&with(DENY_X))
        .objects
        .iter()
        .map(|o| o.name().to_string())
        .find(|n| n.starts_with("ingress-") && !n.starts_with("ingress-deny-"))
        .unwrap();
    a.backend_mut()
        .state_mut()
        .apply_script(&format!("flush map inet flock ingress-chains\nflush chain inet flock {chain}\ndelete chain inet flock {chain}"))
        .unwrap();
    let next = ruleset(&with(ALLOW_MIX));
    assert!(matches!(a.apply(&next).unwrap(), Outcome::Applied { incremental: false, .. }));
    assert!(a.backend().last_script.clone().unwrap().starts_with("add table"));
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
}

#[test]
fn stale_maps_and_the_chains_they_jump_to_go_together() {
    use crate::render::{Chain, Element, Set};
    let base = ruleset(&testkit::base_cluster());
    let mut prev = base.clone();
    prev.objects.push(Object::Chain(Chain {
        name: "extra-target".into(),
        comment: "c".into(),
        hook: None,
        rules: vec![crate::render::Rule::verdict(crate::render::Verdict::Accept)].into(),
    }));
    prev.objects.push(Object::Set(Set {
        name: "extra-map".into(),
        comment: "m".into(),
        key: vec!["ifname"],
        data: Some("verdict"),
        interval: false,
        timeout: false,
        limit: None,
        elements: vec![Element {
            key: crate::render::Key::one(crate::render::KeyPart::Ifname("flk0".into())),
            comment: "e".into(),
            verdict: Some(crate::render::Verdict::Jump("extra-target".into())),
        }]
        .into(),
    }));
    let mut a = Applier::new(FakeNft::new());
    a.apply(&prev).unwrap();
    assert!(matches!(a.apply(&base).unwrap(), Outcome::Applied { incremental: true, stale_deleted: 2 }));
    assert_eq!(a.backend().table().unwrap().dump(), crate::nft::canonical(&base.to_text()).unwrap());
}

/// A backend whose next `garbled` reads list the table wrongly, as a read of a set whose hash
/// table the kernel is rehashing may.
struct Rehashing {
    inner: FakeNft,
    garbled: usize,
}

impl Backend for Rehashing {
    fn run(&mut self, script: &str) -> Result<(), ApplyError> {
        self.inner.run(script)
    }
    fn check(&mut self, script: &str) -> Result<(), ApplyError> {
        self.inner.check(script)
    }
    fn list_table(&mut self) -> Result<Option<String>, ApplyError> {
        self.inner.list_table()
    }
    fn read_state(&mut self) -> Result<Option<state::TableState>, ApplyError> {
        let read = self.inner.read_state()?;
        if self.garbled == 0 {
            return Ok(read);
        }
        self.garbled -= 1;
        Ok(read.map(|s| match s {
            state::TableState::Canonical(text) => state::TableState::Canonical(format!("{text}# an element listed twice\n")),
            typed => typed,
        }))
    }
    fn list_objects(&mut self) -> Result<Vec<ObjectInfo>, ApplyError> {
        self.inner.list_objects()
    }
}

#[test]
fn a_difference_is_drift_only_when_a_second_read_shows_it() {
    let rs = ruleset(&testkit::base_cluster());
    // The baseline is what two agreeing reads show: a garbled first read is not kept.
    let mut a = Applier::new(Rehashing { inner: FakeNft::new(), garbled: 0 });
    a.apply(&rs).unwrap();
    a.backend_mut().garbled = 1;
    a.record_baseline().unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
    // One garbled read is not drift, whichever read it is.
    a.backend_mut().garbled = 1;
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
    // A difference every read shows is.
    a.backend_mut().garbled = 3;
    assert!(matches!(a.check_drift().unwrap(), Drift::Changed { .. }));
    // So is a change behind flock's back.
    a.backend_mut().inner.state_mut().apply_script("flush chain inet flock from-pods").unwrap();
    assert!(matches!(a.check_drift().unwrap(), Drift::Changed { .. }));
}

/// A full sync keeps the render's timed sets (what the DNS proxy learned lives there): not
/// flushed, not deleted; a timed set the render no longer has goes, like any stale set.
#[test]
fn a_full_sync_keeps_the_timed_sets_it_renders() {
    use crate::render::Set;
    let mut rs = ruleset(&testkit::base_cluster());
    let timed = |name: &str| Set {
        name: name.into(),
        comment: "learned".into(),
        key: vec!["ipv4_addr"],
        data: None,
        interval: false,
        timeout: true,
        limit: None,
        elements: Vec::new().into(),
    };
    rs.objects.insert(0, Object::Set(timed("domains-v4-kept")));
    let existing: BTreeSet<(Kind, String)> =
        [(Kind::Set, "domains-v4-kept".to_string()), (Kind::Set, "domains-v4-gone".to_string()), (Kind::Chain, BASE_CHAIN.to_string())]
            .into();
    let (flush, delete) = full_sync_removals(&rs, &existing);
    let names = |v: &Objects<'_>| v.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&delete), vec!["domains-v4-gone".to_string()]);
    assert!(!names(&flush).contains(&"domains-v4-kept".to_string()));
    let script = transaction(&rs, &existing, &rs.to_text());
    assert!(
        !script.contains("delete set inet flock domains-v4-kept") && script.contains("delete set inet flock domains-v4-gone"),
        "{script}"
    );
}

/// The merge over the sets in key order finds what comparing element by element finds: added, removed and
/// changed elements (a changed comment is deleted and added again), in each set's order.
#[test]
fn element_differences_of_ordered_sets_are_found_by_a_merge() {
    use crate::render::{Element, Key, KeyPart, Set};
    let set = |v: Vec<(u32, &str)>| Set {
        name: "s".into(),
        comment: "c".into(),
        key: vec!["ipv4_addr"],
        data: None,
        interval: false,
        timeout: false,
        limit: None,
        elements: std::sync::Arc::new(
            v.into_iter()
                .map(|(a, c)| Element {
                    key: Key::one(KeyPart::Addr(std::net::Ipv4Addr::from(0xc612_0000 + a).into())),
                    comment: c.into(),
                    verdict: None,
                })
                .collect(),
        ),
    };
    let mut rng = crate::synth::Rng::new(5);
    for _ in 0..200 {
        let pick = |rng: &mut crate::synth::Rng| {
            let mut v: Vec<(u32, &str)> = Vec::new();
            for a in 0..40 {
                if rng.below(2) == 0 {
                    v.push((a, if rng.below(8) == 0 { "x" } else { "p" }));
                }
            }
            v
        };
        let (before, after) = (set(pick(&mut rng)), set(pick(&mut rng)));
        let (gone, new) = element_difference(&before, &after);
        // The keyed comparison, by hand.
        let want_gone: Vec<&Element> = before.elements.iter().filter(|e| !after.elements.contains(e)).collect();
        let want_new: Vec<&Element> = after.elements.iter().filter(|e| !before.elements.contains(e)).collect();
        assert_eq!((gone, new), (want_gone, want_new));
    }
    // Out of key order (sets sorted as text): sorted first, the same answer.
    let (a, b) = (set(vec![(10, "p"), (9, "p")]), set(vec![(10, "p"), (8, "p")]));
    let (gone, new) = element_difference(&a, &b);
    assert_eq!((gone.len(), new.len()), (1, 1));
}
