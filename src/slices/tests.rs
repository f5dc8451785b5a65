use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::model::{ContainerPort, Labels, Pod, PodPhase, Protocol};

fn pod(ns: &str, name: &str, i: u32, app: &str) -> Pod {
    let mut labels = Labels::new();
    labels.insert("app", app);
    Pod {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels,
        node: Some(format!("node-{}", i % 3)),
        phase: PodPhase::Running,
        ips: vec![IpAddr::V4(Ipv4Addr::from(0xC612_0000 + i))],
        host_network: false,
        ports: vec![
            ContainerPort { name: Some("http".into()), port: 8080, protocol: Protocol::Tcp },
            ContainerPort { name: None, port: 9090, protocol: Protocol::Tcp },
        ],
        created: Some(1_700_000_000 + i64::from(i)),
        unpublished: false,
    }
}

fn members(pods: &[Pod]) -> BTreeMap<String, Member> {
    pods.iter().filter_map(Member::of).map(|m| (m.uid.clone(), m)).collect()
}

/// `writes` applied to `slices`, as the API server would hold them.
fn apply(slices: &mut BTreeMap<String, PodSliceSpec>, writes: Vec<Write>) {
    for w in writes {
        match w {
            Write::Create { name, spec } => assert!(slices.insert(name, spec).is_none(), "created twice"),
            Write::Update { name, spec } => assert!(slices.insert(name, spec).is_some(), "updated a slice that is not there"),
            Write::Delete { name } => assert!(slices.remove(&name).is_some(), "deleted a slice that is not there"),
        }
    }
}

/// The slices as `plan` reads them.
fn borrowed(slices: &BTreeMap<String, PodSliceSpec>) -> BTreeMap<&str, &PodSliceSpec> {
    slices.iter().map(|(n, s)| (n.as_str(), s)).collect()
}

fn plan_all(slices: &BTreeMap<String, PodSliceSpec>, pods: &[Pod], max: usize) -> Vec<Write> {
    plan("shop", &borrowed(slices), &members(pods), |n| slices.contains_key(n), max)
}

fn decoded(slices: &BTreeMap<String, PodSliceSpec>) -> Vec<Pod> {
    let mut out: Vec<Pod> = slices
        .iter()
        .flat_map(|(name, spec)| {
            let (pods, problems) = decode(name, spec);
            assert!(problems.is_empty(), "{problems:?}");
            pods
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn shop(n: u32) -> Vec<Pod> {
    (0..n).map(|i| pod("shop", &format!("web-{i:03}"), i, if i % 2 == 0 { "web" } else { "api" })).collect()
}

/// 250 pods become three slices of 100, 100 and 50, named by index; planning again changes
/// nothing; what the slices decode to is the pods, less their unnamed ports.
#[test]
fn pods_fill_slices_of_the_maximum_and_read_back_whole() {
    let pods = shop(250);
    let mut slices = BTreeMap::new();
    let writes = plan_all(&slices, &pods, 100);
    assert_eq!(writes.iter().map(Write::name).collect::<Vec<_>>(), ["shop-0", "shop-1", "shop-2"]);
    apply(&mut slices, writes);
    assert_eq!(slices.values().map(|s| s.pods.len()).collect::<Vec<_>>(), [100, 100, 50]);
    // Two workloads' labels: two sets per slice, whatever the number of pods.
    assert!(slices.values().all(|s| s.label_sets.len() == 2 && s.namespace == "shop"));
    assert_eq!(plan_all(&slices, &pods, 100), []);

    let mut want = pods.clone();
    for p in &mut want {
        p.ports.retain(|p| p.name.is_some());
    }
    assert_eq!(decoded(&slices), want);
}

/// One pod's change rewrites the one slice holding it; a new pod goes where there is room;
/// pods that end leave their slice, and a slice left empty is deleted.
#[test]
fn placement_is_sticky_and_empty_slices_go() {
    let mut pods = shop(250);
    let mut slices = BTreeMap::new();
    let w = plan_all(&slices, &pods, 100);
    apply(&mut slices, w);
    let holder = |slices: &BTreeMap<String, PodSliceSpec>, uid: &str| {
        slices.iter().find(|(_, s)| s.pods.iter().any(|p| p.uid == uid)).map(|(n, _)| n.clone())
    };
    let before = holder(&slices, "uid-web-150");

    pods[150].labels.insert("app", "canary");
    let writes = plan_all(&slices, &pods, 100);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert!(matches!(&writes[0], Write::Update { name, .. } if Some(name) == before.as_ref()));
    apply(&mut slices, writes);
    assert_eq!(holder(&slices, "uid-web-150"), before);

    // A status-only change (a port without a name, the phase Pending → Running stays
    // Running) writes nothing.
    pods[10].ports.push(ContainerPort { name: None, port: 1234, protocol: Protocol::Udp });
    assert_eq!(plan_all(&slices, &pods, 100), []);

    // Every pod ends: terminal, host-networked or gone. A new pod takes the room of an
    // existing slice, not a new one.
    for p in pods.iter_mut().take(50) {
        p.phase = PodPhase::Succeeded;
    }
    pods.truncate(100);
    pods.iter_mut().skip(50).for_each(|p| p.host_network = true);
    pods.push(pod("shop", "zz-new", 999, "web"));
    let writes = plan_all(&slices, &pods, 100);
    let names: BTreeSet<(&str, &str)> = writes
        .iter()
        .map(|w| match w {
            Write::Create { name, .. } => ("create", name.as_str()),
            Write::Update { name, .. } => ("update", name.as_str()),
            Write::Delete { name } => ("delete", name.as_str()),
        })
        .collect();
    // Every pod left; the new one goes into the first slice by name, which has room now,
    // and the other two, empty, are deleted.
    assert_eq!(names, BTreeSet::from([("update", "shop-0"), ("delete", "shop-1"), ("delete", "shop-2")]));
    apply(&mut slices, writes);
    assert_eq!(decoded(&slices).iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["zz-new"]);
}

/// A lower maximum moves the pods over it into new slices, whose names avoid every slice
/// name already taken in the cluster.
#[test]
fn a_lower_maximum_moves_the_excess_and_new_names_avoid_taken_ones() {
    let pods = shop(30);
    let mut slices = BTreeMap::new();
    let w = plan_all(&slices, &pods, 100);
    apply(&mut slices, w);
    let mut taken: BTreeSet<String> = slices.keys().cloned().collect();
    taken.insert("shop-1".into());
    let writes = plan("shop", &borrowed(&slices), &members(&pods), |n| taken.contains(n), 10);
    let created: Vec<&str> = writes.iter().filter(|w| matches!(w, Write::Create { .. })).map(Write::name).collect();
    assert_eq!(created, ["shop-2", "shop-3"]);
    apply(&mut slices, writes);
    assert_eq!(slices.values().map(|s| s.pods.len()).collect::<Vec<_>>(), [10, 10, 10]);
    assert_eq!(decoded(&slices).len(), 30);
}

/// Only pods that can be peers are shown.
#[test]
fn only_peers_are_members() {
    let base = pod("shop", "a", 1, "web");
    assert!(Member::of(&base).is_some());
    for change in [
        |p: &mut Pod| p.host_network = true,
        |p: &mut Pod| p.phase = PodPhase::Failed,
        |p: &mut Pod| p.ips.clear(),
        |p: &mut Pod| p.node = None,
    ] {
        let mut p = base.clone();
        change(&mut p);
        assert_eq!(Member::of(&p), None, "{p:?}");
    }
}

/// A slice is read as hostile input: each pod that does not parse is left out and named;
/// the others are read.
#[test]
fn decode_leaves_out_what_it_cannot_read_and_names_it() {
    let mut slices = BTreeMap::new();
    let w = plan_all(&slices, &shop(8), 100);
    apply(&mut slices, w);
    let mut spec = slices.remove("shop-0").unwrap();
    spec.pods[0].ips = vec!["198.18.0.300".into()];
    spec.pods[1].labels = 7;
    spec.pods[2].ips = vec!["198.18.0.1".into(), "198.18.0.2".into()];
    spec.pods[3].ports[0].port = 0;
    spec.pods[4].uid = spec.pods[5].uid.clone();
    spec.label_sets.push(BTreeMap::from([("bad key!".to_string(), "x".to_string())]));
    spec.pods[6].labels = 2;
    let (pods, problems) = decode("shop-0", &spec);
    assert_eq!(pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["web-004", "web-007"]);
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 6, "{text:#?}");
    assert!(text[0].starts_with("PodSlice shop-0: pod shop/web-000: \"198.18.0.300\" is not an IP address"), "{}", text[0]);
    assert!(text[1].contains("web-001: label set 7 does not exist (3 in the slice)"), "{}", text[1]);
    assert!(text[2].contains("web-002: at most one address per family"), "{}", text[2]);
    assert!(text[3].contains("web-003: port \"http\": 0 is not a port number (1-65535)"), "{}", text[3]);
    assert!(text[4].contains("web-005: uid uid-web-005 appears twice"), "{}", text[4]);
    assert!(text[5].contains("web-006: label key \"bad key!\""), "{}", text[5]);

    spec.namespace = "Not_A_Namespace".into();
    let (pods, problems) = decode("shop-0", &spec);
    assert!(pods.is_empty() && problems.len() == spec.pods.len());
}
