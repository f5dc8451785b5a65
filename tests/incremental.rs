#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The incremental translator and render cache against the full translation and render
//! (`flock::fuzzing::incremental`): random step sequences from seeded inputs, and scenarios
//! that each take one path the incremental code must get right, checked after every step.
//!
//! `FLOCK_INCREMENTAL_CASES` (default 300) inputs from `FLOCK_INCREMENTAL_SEED` (default 1);
//! a long run: `FLOCK_INCREMENTAL_CASES=100000 cargo test --release --test incremental`.

use std::net::IpAddr;

use flock::fuzzing::differential::seeded_bytes;
use flock::fuzzing::incremental::{Harness, Mutation, incremental};
use flock::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpRule, CnpSubject};
use flock::model::{ContainerPort, LabelSelector, LocalEndpoint, ObjectRef, Pod, PodPhase, Protocol, Snapshot};
use flock::render::RenderOptions;
use flock::testkit::{base_cluster, policies, summary};
use flock::translate::{Direction, NodePolicy, Options, PeerDef};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_step_sequences_agree_with_the_full_pipeline() {
    let cases = env_u64("FLOCK_INCREMENTAL_CASES", 300);
    let seed = env_u64("FLOCK_INCREMENTAL_SEED", 1);
    let mut renders = 0;
    for case in 0..cases {
        let s = seed.wrapping_mul(1_000_003).wrapping_add(case);
        // 200 to 4,000 bytes: a few steps to the full 16.
        let len = 200 + usize::try_from(s.wrapping_mul(0x9e37_79b9) % 3801).unwrap();
        let data = seeded_bytes(s, len);
        match std::panic::catch_unwind(|| incremental(&data)) {
            Ok(texts) => renders += texts.len(),
            Err(e) => {
                let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("seed {s} ({len} bytes; FLOCK_INCREMENTAL_SEED/CASES reproduce it): {}", msg.unwrap_or_default());
            }
        }
    }
    // The inputs do reach the steps: most render several different rulesets.
    assert!(renders as u64 >= cases * 2, "only {renders} distinct renders in {cases} inputs");
}

// ---------------------------------------------------------------------------------------------
// Scenarios, on the conformance cluster from node-1 (local pods x/a, x/c, y/b, z/a, z/c), in
// both render shapes.

const SHAPES: [RenderOptions; 2] =
    [RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT }, RenderOptions { peer_classes_from: 8, ..RenderOptions::DEFAULT }];

fn harness(snapshot: Snapshot, shape: RenderOptions) -> Harness {
    let endpoints = snapshot.derived_endpoints("node-1");
    Harness::new(snapshot, endpoints, Options::default(), shape).unwrap_or_else(|e| panic!("{e}"))
}

fn with_policies(yaml: &str) -> Snapshot {
    let mut s = base_cluster();
    for p in policies(yaml) {
        s.upsert_policy(p);
    }
    s
}

/// Applies the mutations as one step; panics with the harness's description on a mismatch.
fn step(h: &mut Harness, mutations: impl IntoIterator<Item = Mutation>) {
    for m in mutations {
        h.apply(m);
    }
    if let Err(e) = h.step() {
        panic!("{e}");
    }
}

fn pod(h: &Harness, key: &str) -> Pod {
    let (ns, name) = key.split_once('/').unwrap();
    h.snapshot().pod_by_name(&ObjectRef::new(ns, name)).unwrap_or_else(|| panic!("no pod {key}")).clone()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ingress(h: &Harness, pod: &str) -> String {
    summary(h.policy(), pod, Direction::Ingress)
}

fn egress(h: &Harness, pod: &str) -> String {
    summary(h.policy(), pod, Direction::Egress)
}

#[test]
fn a_pod_relabelled_into_and_out_of_a_peer_selector() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]
";
    for shape in SHAPES {
        let mut h = harness(with_policies(yaml), shape);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
        // A remote pod and a local one join the selector ...
        let (mut b, mut c) = (pod(&h, "x/b"), pod(&h, "x/c"));
        b.labels.insert("app", "web");
        c.labels.insert("app", "web");
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [x/b] *");
        step(&mut h, [Mutation::UpsertPod(c.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [x/b,x/c] *");
        // ... and leave it, one by one and both in one step.
        b.labels.insert("app", "db");
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [x/c] *");
        b.labels.insert("app", "web");
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        b.labels.remove("app");
        c.labels.remove("app");
        step(&mut h, [Mutation::UpsertPod(b), Mutation::UpsertPod(c)]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
    }
}

/// A remote pod with `app: web` in namespace `ns` reporting `addr`.
fn web_pod(ns: &str, name: &str, addr: &str, created: i64) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{ns}-{name}"),
        labels: [("app", "web")].into(),
        node: Some("node-2".into()),
        phase: PodPhase::Running,
        ips: vec![ip(addr)],
        host_network: false,
        ports: vec![],
        created: Some(created),
        unpublished: false,
    }
}

#[test]
fn a_shared_address_belongs_to_the_newer_pod_and_returns_to_the_older() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}]}]
";
    for shape in SHAPES {
        let mut h = harness(with_policies(yaml), shape);
        let older = web_pod("y", "old", "198.18.2.50", 1);
        let mut newer = web_pod("z", "new", "198.18.2.50", 2);
        step(&mut h, [Mutation::UpsertPod(older.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [y/old] *");
        // The newer pod owns the address: the set names it, not the older one.
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [z/new] *");
        // Not a peer any more (another label): the address is still the newer pod's, so
        // the set has nobody.
        newer.labels.insert("app", "db");
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
        newer.labels.insert("app", "web");
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [z/new] *");
        // The newer one goes: the older one regains the address.
        step(&mut h, [Mutation::RemovePod(newer.uid.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [y/old] *");
        // And again through a terminal phase and a readdress instead of a removal.
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [z/new] *");
        newer.phase = PodPhase::Succeeded;
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [y/old] *");
        newer.phase = PodPhase::Running;
        step(&mut h, [Mutation::UpsertPod(newer.clone())]);
        newer.ips = vec![ip("198.18.2.51")];
        step(&mut h, [Mutation::UpsertPod(newer)]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [y/old,z/new] *");
    }
}

#[test]
fn a_namespace_relabelled_into_and_out_of_a_namespace_selector() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-blue, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: blue}}}]}]
";
    for shape in SHAPES {
        let mut h = harness(with_policies(yaml), shape);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
        let mut y = h.snapshot().namespace("y").unwrap().clone();
        y.labels.insert("team", "blue");
        step(&mut h, [Mutation::UpsertNamespace(y.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [y/a,y/b,y/c] *");
        y.labels.remove("team");
        step(&mut h, [Mutation::UpsertNamespace(y.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
        // Removed while matching: its pods stay (they are in the snapshot), but no Namespace
        // object means no labels to match.
        y.labels.insert("team", "blue");
        step(&mut h, [Mutation::UpsertNamespace(y)]);
        step(&mut h, [Mutation::RemoveNamespace("y".into())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
    }
}

#[test]
fn a_policy_added_then_removed() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}, {ipBlock: {cidr: 198.18.2.0/24, except: [198.18.2.12/32]}}], ports: [{port: 80}]}]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: serve-81-udp, protocol: UDP}]}]
";
    for shape in SHAPES {
        let mut h = harness(base_cluster(), shape);
        assert!(h.policy().peer_sets.is_empty() && h.policy().port_sets.is_empty());
        assert_eq!(ingress(&h, "x/a"), "open");
        let np = policies(yaml).remove(0);
        step(&mut h, [Mutation::UpsertPolicy(np.clone())]);
        assert_eq!(h.policy().peer_sets.len(), 2);
        assert_eq!(h.policy().port_sets.len(), 1);
        assert!(ingress(&h, "x/a").contains("[x/b] TCP:80"), "{}", ingress(&h, "x/a"));
        assert_eq!(egress(&h, "x/a"), "isolated: [y/a:udp/81,y/b:udp/81,y/c:udp/81]");
        // Changed: another peer, another port.
        let mut changed = np.clone();
        changed.ingress[0].peers.remove(1);
        changed.egress.clear();
        changed.policy_types = vec!["Ingress".into()];
        step(&mut h, [Mutation::UpsertPolicy(changed)]);
        assert_eq!(h.policy().peer_sets.len(), 1);
        assert!(h.policy().port_sets.is_empty());
        assert_eq!(egress(&h, "x/a"), "open");
        step(&mut h, [Mutation::RemovePolicy(np.key())]);
        assert!(h.policy().peer_sets.is_empty() && h.policy().port_sets.is_empty());
        assert_eq!(ingress(&h, "x/a"), "open");
    }
}

/// `metadata.generation` is reported, not enforced: a policy whose generation alone changed
/// (a spec edit and its revert) translates and renders exactly as before.
#[test]
fn a_policy_whose_generation_alone_changed_renders_the_same() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x, generation: 1}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}]
";
    for shape in SHAPES {
        let mut h = harness(base_cluster(), shape);
        let np = policies(yaml).remove(0);
        assert_eq!(np.generation, Some(1));
        step(&mut h, [Mutation::UpsertPolicy(np.clone())]);
        let (policy, text) = (h.policy().clone(), h.rendered().to_string());
        step(&mut h, [Mutation::UpsertPolicy(flock::model::NetworkPolicy { generation: Some(2), ..np })]);
        assert_eq!(h.snapshot().policy(&ObjectRef::new("x", "web")).unwrap().generation, Some(2));
        assert_eq!(*h.policy(), policy);
        assert_eq!(h.rendered(), text);
    }
}

#[test]
fn a_local_endpoint_added_for_an_existing_pod_then_removed() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-d, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: d}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: d-from-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: d}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: a}}}]}]
";
    for shape in SHAPES {
        let mut s = with_policies(yaml);
        // x/d is on node-1, its addresses not in the API yet.
        let mut d = s.pod_by_name(&ObjectRef::new("x", "a")).unwrap().clone();
        d.name = "d".into();
        d.uid = "uid-x-d".into();
        d.labels = [("pod", "d")].into();
        d.ips = vec![];
        s.upsert_pod(d.clone());
        let mut h = harness(s, shape);
        assert_eq!(ingress(&h, "x/a"), "isolated: [] *");
        assert_eq!(ingress(&h, "x/d"), "no endpoint for x/d");
        // CNI ADD: the endpoint's address is the pod's (the API has not caught up).
        let mut ep = LocalEndpoint::for_pod(&d);
        ep.addrs = vec![ip("198.18.1.99"), ip("2001:db8:1::99")];
        step(&mut h, [Mutation::AddEndpoint(ep.clone())]);
        assert_eq!(ingress(&h, "x/a"), "isolated: [x/d] *");
        assert_eq!(ingress(&h, "x/d"), "isolated: [x/a] *");
        // The API catches up with another address: the endpoint's still holds.
        d.ips = vec![ip("198.18.1.98")];
        step(&mut h, [Mutation::UpsertPod(d.clone())]);
        let set: Vec<IpAddr> = peer_addresses(h.policy(), "pods pod=d");
        assert!(set.contains(&ip("198.18.1.99")) && !set.contains(&ip("198.18.1.98")), "{set:?}");
        // CNI DEL: the pod's API address again, no endpoint.
        step(&mut h, [Mutation::RemoveEndpoint(ep.interface.clone())]);
        assert_eq!(ingress(&h, "x/d"), "no endpoint for x/d");
        assert_eq!(peer_addresses(h.policy(), "pods pod=d"), [ip("198.18.1.98")]);
        // An endpoint before its pod: isolated (unknown pod) until the pod arrives.
        let e = LocalEndpoint {
            interface: "flk000000000001".into(),
            container_id: "c1".into(),
            pod: ObjectRef::new("x", "e"),
            pod_uid: Some("uid-x-e".into()),
            addrs: vec![ip("198.18.1.97")],
        };
        step(&mut h, [Mutation::AddEndpoint(e)]);
        let mut pe = d.clone();
        pe.name = "e".into();
        pe.uid = "uid-x-e".into();
        step(&mut h, [Mutation::UpsertPod(pe.clone())]);
        assert_eq!(ingress(&h, "x/e"), "isolated: [x/a] *");
        assert_eq!(peer_addresses(h.policy(), "pods pod=d").len(), 2);
        // The endpoint's pod goes and comes back, then moves to another node: an unchanged
        // endpoint keeps its pod's last lookup only while the journal says nothing of it.
        step(&mut h, [Mutation::RemovePod(pe.uid.clone())]);
        assert_ne!(ingress(&h, "x/e"), "isolated: [x/a] *");
        assert_eq!(peer_addresses(h.policy(), "pods pod=d").len(), 1);
        step(&mut h, [Mutation::UpsertPod(pe.clone())]);
        assert_eq!(ingress(&h, "x/e"), "isolated: [x/a] *");
        pe.node = Some("node-2".into());
        step(&mut h, [Mutation::UpsertPod(pe)]);
        assert_eq!(peer_addresses(h.policy(), "pods pod=d").len(), 2);
    }
}

/// A restarted sandbox: a second endpoint for a local pod, reported before the old one's
/// CNI DEL. Of two endpoints of one pod, the first in endpoint order gives the pod's
/// addresses (`translate::Addresses`), so the new one takes over while both are listed — and
/// the old one's addresses, which the API never reported, leave the pod's peer sets.
#[test]
fn a_second_endpoint_for_a_pod_takes_over_its_addresses() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
";
    let y = |local: &str| vec![ip(local), ip("198.18.2.21"), ip("198.18.2.23")];
    for shape in SHAPES {
        let mut h = harness(with_policies(yaml), shape);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.22"));
        // CNI reports y/b at an address the API does not (yet).
        let mut eps = h.endpoints().to_vec();
        let old = eps.iter_mut().find(|e| e.pod == ObjectRef::new("y", "b")).unwrap();
        old.addrs = vec![ip("198.18.1.98")];
        let old = old.clone();
        step(&mut h, [Mutation::SetEndpoints(eps)]);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.98"));
        // The new sandbox's interface sorts before the old one's; its address is the API's.
        let new = LocalEndpoint {
            interface: "flk000000000000".into(),
            container_id: "restarted".into(),
            addrs: vec![ip("198.18.1.22")],
            ..old.clone()
        };
        step(&mut h, [Mutation::AddEndpoint(new.clone())]);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.22"));
        step(&mut h, [Mutation::RemoveEndpoint(old.interface.clone())]);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.22"));
        // And back: the old one again (sorting after), then the new one gone.
        step(&mut h, [Mutation::AddEndpoint(old)]);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.22"));
        step(&mut h, [Mutation::RemoveEndpoint(new.interface)]);
        assert_eq!(peer_addresses(h.policy(), "ns=y"), y("198.18.1.98"));
    }
}

/// Every address of the peer sets whose description contains `what`.
fn peer_addresses(np: &NodePolicy, what: &str) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = np
        .peer_sets
        .iter()
        .filter(|(d, _)| d.to_string().contains(what))
        .flat_map(|(_, s)| s.v4.keys().map(|n| IpAddr::V4(n.addr())).chain(s.v6.keys().map(|n| IpAddr::V6(n.addr()))))
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn a_node_relabelled_under_a_cluster_policy_nodes_peer() {
    let selector = |k: &str, v: &str| LabelSelector { match_labels: [(k.to_string(), v.to_string())].into(), ..Default::default() };
    let cnp = ClusterNetworkPolicy {
        name: "no-infra".into(),
        tier: "Admin".into(),
        priority: Some(1),
        subject: CnpSubject::Namespaces(LabelSelector::default()),
        egress: vec![CnpRule {
            name: None,
            action: "Deny".into(),
            peers: vec![CnpPeer::Nodes(selector("role", "infra"))],
            protocols: None,
        }],
        ..Default::default()
    };
    for shape in SHAPES {
        let mut h = harness(base_cluster(), shape);
        step(&mut h, [Mutation::UpsertClusterPolicy(cnp.clone())]);
        let nodes = |h: &Harness| -> Vec<IpAddr> {
            let sets: Vec<_> = h.policy().peer_sets.iter().filter(|(d, _)| matches!(d, PeerDef::Nodes(_))).collect();
            assert_eq!(sets.len(), 1);
            sets[0].1.v4.keys().map(|n| IpAddr::V4(n.addr())).collect()
        };
        assert!(nodes(&h).is_empty());
        let mut n2 = h.snapshot().node("node-2").unwrap().clone();
        n2.labels.insert("role", "infra");
        step(&mut h, [Mutation::UpsertNode(n2.clone())]);
        assert_eq!(nodes(&h), [ip("198.18.0.2")]);
        // Readdressed while matching.
        n2.addresses.push(ip("198.19.1.2"));
        step(&mut h, [Mutation::UpsertNode(n2.clone())]);
        assert_eq!(nodes(&h), [ip("198.18.0.2"), ip("198.19.1.2")]);
        n2.labels.remove("role");
        step(&mut h, [Mutation::UpsertNode(n2.clone())]);
        assert!(nodes(&h).is_empty());
        // Removed while matching.
        n2.labels.insert("role", "infra");
        step(&mut h, [Mutation::UpsertNode(n2)]);
        step(&mut h, [Mutation::RemoveNode("node-2".into())]);
        assert!(nodes(&h).is_empty());
    }
}

#[test]
fn an_egress_named_port_follows_the_destination_pods_container_port() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: to-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: serve-80-tcp}]}]
";
    for shape in SHAPES {
        let mut h = harness(with_policies(yaml), shape);
        assert_eq!(egress(&h, "x/a"), "isolated: [x/b:tcp/80]");
        let mut b = pod(&h, "x/b");
        for cp in &mut b.ports {
            if cp.name.as_deref() == Some("serve-80-tcp") {
                cp.port = 8080;
            }
        }
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        assert_eq!(egress(&h, "x/a"), "isolated: [x/b:tcp/8080]");
        // The name gone, then back with another protocol (no match for TCP), then as TCP.
        b.ports.retain(|cp| cp.name.as_deref() != Some("serve-80-tcp"));
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        assert_eq!(egress(&h, "x/a"), "isolated: []");
        b.ports.push(ContainerPort { name: Some("serve-80-tcp".into()), port: 81, protocol: Protocol::Udp });
        step(&mut h, [Mutation::UpsertPod(b.clone())]);
        assert_eq!(egress(&h, "x/a"), "isolated: []");
        b.ports.last_mut().unwrap().protocol = Protocol::Tcp;
        step(&mut h, [Mutation::UpsertPod(b)]);
        assert_eq!(egress(&h, "x/a"), "isolated: [x/b:tcp/81]");
    }
}

/// The harness itself: a change the incremental translator is not told about (the snapshot
/// changed, the change list omits it) is noticed.
#[test]
fn the_harness_notices_a_missed_change() {
    let yaml = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]
";
    let mut h = harness(with_policies(yaml), RenderOptions::default());
    let mut b = pod(&h, "x/b");
    b.labels.insert("app", "web");
    h.snapshot_unrecorded().upsert_pod(b);
    let e = h.step().expect_err("a relabel the incremental translator was not told about went unnoticed");
    assert!(e.contains("differs from the full one") && e.contains("198.18.2.12"), "{e}");

    // A whole missed policy, likewise.
    let mut h = harness(base_cluster(), RenderOptions::default());
    h.snapshot_unrecorded().upsert_policy(policies(yaml).remove(0));
    let e = h.step().expect_err("a policy the incremental translator was not told about went unnoticed");
    assert!(e.contains("differs from the full one"), "{e}");
}
