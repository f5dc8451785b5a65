//! The applier against the real kernel, in throwaway network namespaces (root only; see
//! `testkit::kernel::require_root`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flock::apply::kernel::NftCli;
use flock::apply::{Applier, Backend, Drift, Outcome};
use flock::model::{LocalEndpoint, Pod, PodPhase, Snapshot};
use flock::render::{BASE_CHAIN, RenderOptions, Ruleset, render, render_with};
use flock::testkit::kernel::{NetnsGuard, Node, require_root};
use flock::testkit::{self, policies};
use flock::translate::{Options, translate};

const POLICIES: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web-from-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: 80}, {port: 81, protocol: UDP}, {port: serve-80-sctp, protocol: SCTP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-mix, namespace: z}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: c}}, namespaceSelector: {}}]
    ports: [{port: serve-80-tcp}, {port: 8000, endPort: 8100}]
  - to: [{ipBlock: {cidr: 198.18.0.0/15, except: [198.18.2.0/24]}}, {ipBlock: {cidr: '2001:db8::/32', except: ['2001:db8:2::/48']}}]
    ports: [{protocol: UDP, port: 53}]
  - ports: [{protocol: SCTP}]
";

fn snapshot(with_policies: bool) -> Snapshot {
    let mut s = testkit::base_cluster();
    if with_policies {
        for p in policies(POLICIES) {
            s.upsert_policy(p);
        }
    }
    for name in ["z/a", "z/c"] {
        let mut p = s.pod_by_name(&testkit::pod_ref(name)).unwrap().clone();
        let last = p.ips[0].to_string().rsplit('.').next().unwrap().to_string();
        p.ips.push(format!("2001:db8:1::{last}").parse().unwrap());
        s.upsert_pod(p);
    }
    s
}

fn ruleset(s: &Snapshot) -> Ruleset {
    render(&translate(s, &s.derived_endpoints("node-1"), &Options::default()))
}

/// Every pod's allow rules through peer classes (the shape of pods with many rules).
fn ruleset_classes(s: &Snapshot) -> Ruleset {
    render_with(
        &translate(s, &s.derived_endpoints("node-1"), &Options::default()),
        &RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT },
    )
}

fn base_handle(a: &mut Applier<NftCli>) -> u64 {
    a.backend_mut().list_objects().unwrap().into_iter().find(|o| o.name == BASE_CHAIN).unwrap().handle
}

#[test]
fn apply_readback_noop_update_drift_and_failure() {
    if !require_root("apply_readback_noop_update_drift_and_failure") {
        return;
    }
    let ns = NetnsGuard::new("apply");
    let mut a = Applier::new(NftCli::new(ns.netns()));

    // Apply; the kernel's listing equals the render after normalising.
    let rs1 = ruleset(&snapshot(true));
    assert!(matches!(a.apply(&rs1).unwrap(), Outcome::Applied { .. }));
    let listing = a.backend_mut().list_table().unwrap().unwrap();
    assert_eq!(flock::nft::canonical(&listing).unwrap(), flock::nft::canonical(&rs1.to_text()).unwrap(), "kernel listing:\n{listing}");

    // Re-apply is a no-op.
    assert_eq!(a.apply(&rs1).unwrap(), Outcome::Unchanged);
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // An update replaces content, deletes stale objects and keeps the base chain.
    let handle = base_handle(&mut a);
    let rs2 = ruleset(&snapshot(false));
    assert!(matches!(a.apply(&rs2).unwrap(), Outcome::Applied { stale_deleted, incremental: true } if stale_deleted > 0));
    assert_eq!(base_handle(&mut a), handle, "the base chain was re-created");
    let listing = a.backend_mut().list_table().unwrap().unwrap();
    assert_eq!(flock::nft::canonical(&listing).unwrap(), flock::nft::canonical(&rs2.to_text()).unwrap());
    a.apply(&rs1).unwrap();
    assert_eq!(base_handle(&mut a), handle);

    // An injected bad transaction leaves the previous ruleset in force, with nft's message.
    let before = a.backend_mut().list_table().unwrap();
    let err = a.backend_mut().run("add rule inet flock forward counter\nadd rule inet flock forward jump no-such-chain\n").unwrap_err();
    assert!(err.to_string().contains("no-such-chain") || err.to_string().contains("No such file"), "{err}");
    assert_eq!(a.backend_mut().list_table().unwrap(), before);
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // A table edited behind flock's back is drift; a full sync repairs it.
    ns.exec(&["nft", "add", "rule", "inet", "flock", "forward", "counter", "accept"]);
    assert!(matches!(a.check_drift().unwrap(), Drift::Changed { .. }));
    a.invalidate();
    a.apply(&rs1).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
    ns.exec(&["nft", "delete", "table", "inet", "flock"]);
    assert_eq!(a.check_drift().unwrap(), Drift::Missing);
    a.invalidate();
    a.apply(&rs1).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // Every kind of edit is found and named — read over netlink, less handles and counters:
    // an exact set's element gone, a verdict map emptied, a base chain's policy (a rule added
    // is above). Each is repaired by a full sync.
    let set = rs1
        .objects
        .iter()
        .find_map(|o| match o {
            flock::render::Object::Set(s) if s.data.is_none() && !s.interval && !s.timeout && !s.elements.is_empty() => Some(s),
            _ => None,
        })
        .unwrap();
    let map = rs1
        .objects
        .iter()
        .find_map(|o| match o {
            flock::render::Object::Set(s) if s.data.is_some() && !s.elements.is_empty() => Some(s),
            _ => None,
        })
        .unwrap();
    let element = format!("delete element inet flock {} {{ {} }}", set.name, set.elements[0].key);
    let flush = format!("flush map inet flock {}", map.name);
    let policy = format!("add chain inet flock {BASE_CHAIN} {{ policy drop; }}");
    for (edit, named) in [
        (element, format!("set {} differs: {} elements, flock applied {}", set.name, set.elements.len() - 1, set.elements.len())),
        (flush, format!("map {} differs: 0 elements", map.name)),
        (policy, format!("chain {BASE_CHAIN} differs: its declaration changed")),
    ] {
        ns.exec(&["nft", &edit]);
        match a.check_drift().unwrap() {
            Drift::Changed { first_difference } => assert!(first_difference.starts_with(&named), "{edit}: {first_difference}"),
            other => panic!("{edit}: {other:?}"),
        }
        a.invalidate();
        a.apply(&rs1).unwrap();
        assert_eq!(a.check_drift().unwrap(), Drift::InSync, "{edit}");
    }

    // A rule's inline set (an anonymous set) replaced by one with other ports: the kernel may
    // give the new set the old one's name, so the rule's own bytes stay the same; the set's
    // elements do not. (The baseline here includes the rule, as if flock had written it.)
    ns.exec(&["nft", "add rule inet flock forward tcp dport { 7001, 7002 } counter drop"]);
    a.record_baseline().unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);
    let listing = String::from_utf8_lossy(&ns.exec(&["nft", "-a", "list", "chain", "inet", "flock", "forward"]).stdout).to_string();
    let handle = listing
        .lines()
        .find(|l| l.contains("7001"))
        .and_then(|l| l.rsplit_once("# handle ").map(|(_, h)| h.trim().to_string()))
        .unwrap_or_else(|| panic!("{listing}"));
    ns.exec(&["nft", &format!("replace rule inet flock forward handle {handle} tcp dport {{ 7003, 7004 }} counter drop")]);
    match a.check_drift().unwrap() {
        Drift::Changed { first_difference } => assert!(first_difference.starts_with("set __set"), "{first_difference}"),
        other => panic!("an inline set replaced: {other:?}"),
    }
    a.invalidate();
    a.apply(&rs1).unwrap();
    assert_eq!(a.check_drift().unwrap(), Drift::InSync);

    // Other tables are never touched.
    ns.exec(&["nft", "add", "table", "ip", "someone-else"]);
    a.apply(&rs2).unwrap();
    let tables = String::from_utf8_lossy(&ns.exec(&["nft", "list", "tables"]).stdout).to_string();
    assert!(tables.contains("table ip someone-else"), "{tables}");
}

/// Snapshots that differ in policies, peer sets, interval sets, verdict maps and pods.
fn variants() -> Vec<(&'static str, Snapshot)> {
    let mut relabelled = snapshot(true);
    let mut p = relabelled.pod_by_name(&testkit::pod_ref("y/b")).unwrap().clone();
    p.labels.insert("ns", "gone");
    p.labels.insert("pod", "c");
    relabelled.upsert_pod(p);
    let mut fewer = snapshot(true);
    let uid = fewer.pod_by_name(&testkit::pod_ref("y/c")).unwrap().uid.clone();
    fewer.remove_pod(&uid);
    let mut other_cidr = snapshot(false);
    for p in policies(&POLICIES.replace("198.18.2.0/24", "198.18.0.0/23").replace("2001:db8:2::/48", "2001:db8:2::/47")) {
        other_cidr.upsert_policy(p);
    }
    let mut moved = snapshot(true);
    let mut p = moved.pod_by_name(&testkit::pod_ref("z/c")).unwrap().clone();
    p.ips = vec!["198.18.250.9".parse().unwrap(), "2001:db8:1::fa09".parse().unwrap()];
    moved.upsert_pod(p);
    vec![
        ("none", snapshot(false)),
        ("policies", snapshot(true)),
        ("relabelled", relabelled),
        ("fewer-pods", fewer),
        ("other-cidrs", other_cidr),
        ("moved-ip", moved),
    ]
}

#[test]
fn incremental_transactions_reach_exactly_the_render() {
    if !require_root("incremental_transactions_reach_exactly_the_render") {
        return;
    }
    for (shape, ruleset) in [("one rule per allow rule", ruleset as fn(&Snapshot) -> Ruleset), ("peer classes", ruleset_classes)] {
        incremental_transactions_in(shape, ruleset);
    }
}

fn incremental_transactions_in(shape: &str, ruleset: fn(&Snapshot) -> Ruleset) {
    let ns = NetnsGuard::new("incr");
    let mut a = Applier::new(NftCli::new(ns.netns()));
    let variants = variants();
    let renders: std::collections::BTreeSet<String> = variants.iter().map(|(_, s)| ruleset(s).to_text()).collect();
    assert_eq!(renders.len(), variants.len(), "every variant renders differently");
    a.apply(&ruleset(&variants[0].1)).unwrap();
    let handle = base_handle(&mut a);
    let mut current = 0;
    // Every ordered pair of variants, each transition as one incremental transaction.
    for from in 0..variants.len() {
        for to in 0..variants.len() {
            for step in [from, to] {
                if step == current {
                    continue;
                }
                let rs = ruleset(&variants[step].1);
                let ctx = format!("{shape}: {} → {}", variants[current].0, variants[step].0);
                let out = a.apply(&rs).unwrap();
                assert!(matches!(out, Outcome::Applied { incremental: true, .. }), "{ctx}: {out:?}");
                let listing = a.backend_mut().list_table().unwrap().unwrap();
                assert_eq!(flock::nft::canonical(&listing).unwrap(), flock::nft::canonical(&rs.to_text()).unwrap(), "{ctx}:\n{listing}");
                current = step;
            }
        }
    }
    // The shape changes in place (an agent upgrade, or a pod crossing the threshold): one
    // incremental transaction, the base chain (and established flows) untouched.
    let other =
        if ruleset(&variants[0].1) == ruleset_classes(&variants[0].1) { None } else { Some(ruleset_classes as fn(&Snapshot) -> Ruleset) };
    for next in other.into_iter().chain([ruleset]) {
        let rs = next(&variants[current].1);
        let out = a.apply(&rs).unwrap();
        assert!(matches!(out, Outcome::Applied { incremental: true, .. } | Outcome::Unchanged), "{shape}: shape change: {out:?}");
        let listing = a.backend_mut().list_table().unwrap().unwrap();
        assert_eq!(
            flock::nft::canonical(&listing).unwrap(),
            flock::nft::canonical(&rs.to_text()).unwrap(),
            "{shape}: shape change:\n{listing}"
        );
    }
    assert_eq!(base_handle(&mut a), handle, "the base chain was re-created");
}

#[test]
fn render_alone_loads_into_an_empty_namespace() {
    if !require_root("render_alone_loads_into_an_empty_namespace") {
        return;
    }
    let ns = NetnsGuard::new("load");
    let mut nft = NftCli::new(ns.netns());
    nft.check(&ruleset(&snapshot(true)).to_text()).unwrap();
    nft.run(&ruleset(&snapshot(true)).to_text()).unwrap();
}

/// Two pods on one node: `a` (198.18.10.1) and `b` (198.18.10.2, ingress isolated, allowing
/// `a` on every port).
fn two_pods(extra_label: Option<&str>) -> (Snapshot, Pod, Pod) {
    let mut s = Snapshot::new();
    s.upsert_namespace(flock::model::convert::implicit_namespace("t"));
    let mk = |name: &str, ip: &str| Pod {
        namespace: "t".into(),
        name: name.into(),
        uid: flock::model::derived_uid("t", name),
        labels: [("pod".to_string(), name.to_string())].into(),
        node: Some("n1".into()),
        phase: PodPhase::Running,
        ips: vec![ip.parse().unwrap()],
        host_network: false,
        ports: vec![],
        created: None,
        unpublished: false,
    };
    let a = mk("a", "198.18.10.1");
    let mut b = mk("b", "198.18.10.2");
    if let Some(l) = extra_label {
        b.labels.insert("extra", l);
    }
    s.upsert_pod(a.clone());
    s.upsert_pod(b.clone());
    for p in policies(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-a, namespace: t}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: a}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-extra, namespace: t}
spec:
  podSelector: {matchExpressions: [{key: extra, operator: Exists}]}
  ingress: [{from: [{podSelector: {}}], ports: [{port: 9}]}]
",
    ) {
        s.upsert_policy(p);
    }
    (s, a, b)
}

fn node_ruleset(s: &Snapshot) -> Ruleset {
    render(&translate(s, &s.derived_endpoints("n1"), &Options::default()))
}

fn received(ping_output: &str) -> (u64, u64) {
    // "2000 packets transmitted, 2000 received, ..."
    let line = ping_output.lines().find(|l| l.contains("packets transmitted")).unwrap_or_default();
    let nums: Vec<u64> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    (nums.first().copied().unwrap_or(0), nums.get(1).copied().unwrap_or(0))
}

fn tcp_retransmits(ns: &NetnsGuard) -> u64 {
    let out = String::from_utf8_lossy(&ns.exec(&["cat", "/proc/net/snmp"]).stdout).to_string();
    let mut tcp = out.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let i = names.split_whitespace().position(|n| n == "RetransSegs").unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

#[test]
fn flows_survive_100_updates_and_shape_changes_without_loss() {
    if !require_root("flows_survive_100_updates_and_shape_changes_without_loss") {
        return;
    }
    let node = Node::new("node");
    let (s1, a, b) = two_pods(None);
    let (s2, _, _) = two_pods(Some("yes"));
    let ep = |p: &Pod| LocalEndpoint::for_pod(p);
    let pa = node.add_pod("a", &ep(&a).interface, &a.ips);
    let pb = node.add_pod("b", &ep(&b).interface, &b.ips);
    let mut ap = Applier::new(NftCli::new(node.ns.netns()));
    ap.apply(&node_ruleset(&s1)).unwrap();

    // A TCP flow a → b: the server in b echoes, the client in a writes every millisecond.
    let listener = flock::netns::run_in(&pb.ns.netns(), || TcpListener::bind("198.18.10.2:7000")).unwrap().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        loop {
            match conn.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => {
                    total += n;
                    conn.write_all(&buf[..n]).unwrap();
                }
                Err(e) => panic!("server read: {e}"),
            }
        }
    });
    let addr: SocketAddr = "198.18.10.2:7000".parse().unwrap();
    let mut client = flock::netns::run_in(&pa.ns.netns(), || TcpStream::connect_timeout(&addr, Duration::from_secs(2))).unwrap().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let retrans_before = tcp_retransmits(&pa.ns);
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut sent = 0usize;
        let mut echo = [0u8; 64];
        while !stop2.load(Ordering::Relaxed) {
            client.write_all(&[7u8; 64]).unwrap();
            client.read_exact(&mut echo).unwrap();
            sent += 64;
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(client);
        sent
    });

    // ICMP echo a → b every 5 ms while the ruleset is replaced 100 times.
    let ping_ns = pa.ns.name.clone();
    let ping = std::thread::spawn(move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ping_ns, "ping", "-q", "-i", "0.005", "-w", "30", "-c", "1500", "198.18.10.2"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    });
    std::thread::sleep(Duration::from_millis(100));
    // Policy changes, and every other pair of them also a change of the ruleset's shape (one
    // rule per allow rule ↔ peer classes: what replacing an agent of the old shape by the new
    // one does to a live table).
    for i in 0..100 {
        let s = if i % 2 == 0 { &s2 } else { &s1 };
        let np = translate(s, &s.derived_endpoints("n1"), &Options::default());
        let rs = if (i / 2) % 2 == 0 {
            render(&np)
        } else {
            render_with(&np, &RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT })
        };
        assert!(matches!(ap.apply(&rs).unwrap(), Outcome::Applied { .. }));
    }
    let ping_out = ping.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap();
    let echoed = server.join().unwrap();

    let (tx, rx) = received(&ping_out);
    assert!(tx >= 1000, "{ping_out}");
    assert_eq!(rx, tx, "ICMP echoes lost across updates:\n{ping_out}");
    assert_eq!(sent, echoed, "TCP bytes lost");
    assert_eq!(tcp_retransmits(&pa.ns), retrans_before, "TCP had to retransmit: packets were dropped");
}

#[test]
fn unknown_pod_interfaces_are_dropped() {
    if !require_root("unknown_pod_interfaces_are_dropped") {
        return;
    }
    let node = Node::new("node");
    let (s, a, b) = two_pods(None);
    let pa = node.add_pod("a", &LocalEndpoint::for_pod(&a).interface, &a.ips);
    // A pod whose interface flock does not know (its sandbox is new): nothing passes.
    let stranger_ip: IpAddr = "198.18.10.3".parse().unwrap();
    let ps = node.add_pod("s", &flock_cni::host_interface_name("unknown", "eth0"), &[stranger_ip]);
    let _pb = node.add_pod("b", &LocalEndpoint::for_pod(&b).interface, &b.ips);
    Applier::new(NftCli::new(node.ns.netns())).apply(&node_ruleset(&s)).unwrap();
    let ok = |ns: &NetnsGuard, dst: &str| ns.try_exec(&["ping", "-c", "1", "-W", "1", dst]).status.success();
    assert!(ok(&pa.ns, "198.18.10.2"), "a → b allowed by policy");
    assert!(!ok(&pa.ns, "198.18.10.3"), "a → unknown interface must be dropped");
    assert!(!ok(&ps.ns, "198.18.10.1"), "unknown interface → a must be dropped");
    // A spoofed source from a known interface is dropped too.
    pa.ns.ip(&["addr", "add", "198.18.10.9/32", "dev", "eth0"]);
    assert!(!pa.ns.try_exec(&["ping", "-c", "1", "-W", "1", "-I", "198.18.10.9", "198.18.10.2"]).status.success());
}

/// Element batches sent over netlink (`flock::apply::netlink`) are listed by nft exactly as
/// the same change written by nft itself, for every kind of exact set and map flock renders
/// (interface . address, address, interface . protocol . port, address : verdict,
/// interface : verdict, both families); a batch the kernel refuses changes nothing.
#[test]
fn element_batches_over_netlink_list_as_nft_writes_them() {
    if !require_root("element_batches_over_netlink_list_as_nft_writes_them") {
        return;
    }
    use flock::apply::{ElementChange, element_changes, element_script, netlink};
    // Remote peers come and go (elements of peer sets and class maps), a local pod gets
    // another address (the pod-address set): nothing but elements changes.
    let before = snapshot(true);
    let mut after = before.clone();
    for (i, name) in ["y/a", "y/b", "z/c"].into_iter().enumerate() {
        let mut p = after.pod_by_name(&testkit::pod_ref(name)).unwrap().clone();
        p.name = format!("{}-copy", p.name);
        p.uid = format!("{}-copy", p.uid);
        p.node = Some("node-2".into());
        p.ips = vec![format!("198.18.2.{}", 200 + i).parse().unwrap(), format!("2001:db8:2::{}", 200 + i).parse().unwrap()];
        after.upsert_pod(p);
    }
    // With peer classes, a peer that goes may take its class (a chain) along, and the first
    // IPv6 peer makes the IPv6 class map: there, one more copy of a peer, which joins its class.
    let copies = after.clone();
    let mut more = copies.clone();
    let mut p = more.pod_by_name(&testkit::pod_ref("y/a")).unwrap().clone();
    (p.name, p.uid, p.node) = ("a-more".into(), "uid-a-more".into(), Some("node-2".into()));
    p.ips = vec!["198.18.2.210".parse().unwrap(), "2001:db8:2::210".parse().unwrap()];
    more.upsert_pod(p);
    let uid = after.pod_by_name(&testkit::pod_ref("y/c")).unwrap().uid.clone();
    after.remove_pod(&uid);
    // A local pod (node-1) with more addresses: the pod-address sets.
    let mut p = after.pod_by_name(&testkit::pod_ref("y/b")).unwrap().clone();
    p.ips.extend(["198.18.1.99".parse::<IpAddr>().unwrap(), "2001:db8:1::99".parse().unwrap()]);
    after.upsert_pod(p);
    let mut covered = std::collections::BTreeSet::new();
    // Three shapes: as rendered by default, every pod on one rule per allow rule (z/a's
    // egress then matches named ports in a set of address . protocol . port), and every pod on
    // peer classes.
    let one_rule_each = RenderOptions { peer_classes_from: usize::MAX, ..RenderOptions::DEFAULT };
    for (shape, opts, before, after) in [
        ("default", RenderOptions::default(), &before, &after),
        ("rules", one_rule_each, &before, &after),
        ("classes", RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT }, &copies, &more),
    ] {
        let rs1 = render_with(&translate(before, &before.derived_endpoints("node-1"), &Options::default()), &opts);
        let rs2 = render_with(&translate(after, &after.derived_endpoints("node-1"), &Options::default()), &opts);
        let changes = element_changes(&rs1, &rs2).unwrap_or_else(|| {
            let diff: Vec<String> =
                rs1.objects.iter().zip(&rs2.objects).filter(|(a, b)| a != b).map(|(a, b)| format!("{a:?}\n{b:?}")).take(2).collect();
            panic!("{shape}: more than elements changed: {} vs {} objects\n{}", rs1.objects.len(), rs2.objects.len(), diff.join("\n"))
        });
        let changes: Vec<ElementChange<'_>> = changes.into_iter().filter(|c| !c.set.interval).collect();
        assert!(!changes.is_empty(), "{shape}: no element changed");
        for c in &changes {
            covered.insert(format!("{}{}", c.set.key.join(" . "), c.set.data.map(|d| format!(" : {d}")).unwrap_or_default()));
        }
        let (by_netlink, by_nft) = (NetnsGuard::new("nl"), NetnsGuard::new("nlref"));
        let mut listings = Vec::new();
        for (ns, netlink) in [(&by_netlink, true), (&by_nft, false)] {
            let mut nft = NftCli::new(ns.netns());
            nft.run(&rs1.to_text()).unwrap();
            if netlink {
                flock::netns::run_in(&ns.netns(), || netlink::write(&changes)).unwrap().unwrap();
            } else {
                nft.run(&element_script(&changes)).unwrap();
            }
            listings.push(nft.list_table().unwrap().unwrap());
        }
        assert_eq!(listings[0], listings[1], "{shape}: the netlink batch lists differently from nft's");

        // Refused: an element to delete that is not there. The batch's additions are not
        // committed either.
        let key = flock::render::Key::new(vec![
            flock::render::KeyPart::Ifname("flk000000000000".into()),
            flock::render::KeyPart::Addr("198.18.1.250".parse().unwrap()),
        ]);
        let missing = flock::render::Element { key, comment: String::new(), verdict: None };
        let pod_set = rs2.objects.iter().find_map(|o| match o {
            flock::render::Object::Set(s) if s.name == "pod-addrs-v4" => Some(s),
            _ => None,
        });
        let pod_set = pod_set.expect("the pod-address set");
        let mut bad = changes.clone();
        bad.push(ElementChange { set: pod_set, delete: vec![&missing], add: vec![] });
        let ns = NetnsGuard::new("nlbad");
        let mut nft = NftCli::new(ns.netns());
        nft.run(&rs1.to_text()).unwrap();
        let e = flock::netns::run_in(&ns.netns(), || netlink::write(&bad)).unwrap().unwrap_err();
        assert!(e.to_string().contains("pod-addrs-v4"), "{e}");
        assert!(!e.is_unsent(), "{e}");
        assert_eq!(
            flock::nft::canonical(&nft.list_table().unwrap().unwrap()).unwrap(),
            flock::nft::canonical(&rs1.to_text()).unwrap(),
            "{shape}: a refused batch changed the table"
        );
    }
    // The copy of z/c brings its named port: elements of the named-port sets, whose keys
    // concatenate a protocol and a port (z/a's egress on one rule per allow rule).
    for kind in [
        "ifname . ipv4_addr",
        "ifname . ipv6_addr",
        "ipv4_addr",
        "ipv4_addr : verdict",
        "ipv6_addr : verdict",
        "ipv4_addr . inet_proto . inet_service",
        "ipv6_addr . inet_proto . inet_service",
    ] {
        assert!(covered.contains(kind), "no change of a {kind} set: {covered:?}");
    }
}

/// The applier sends a change of elements only as a netlink batch (its `nft` here is a path
/// that does not exist, so nothing went through nft), and the kernel then holds exactly the
/// render.
#[test]
fn the_applier_sends_element_changes_over_netlink() {
    if !require_root("the_applier_sends_element_changes_over_netlink") {
        return;
    }
    let ns = NetnsGuard::new("nlapply");
    let mut a = Applier::new(NftCli::new(ns.netns())).defer_baseline();
    let (mut s, ..) = two_pods(None);
    let mut prev = node_ruleset(&s);
    a.apply(&prev).unwrap();
    *a.backend_mut() = NftCli::new(ns.netns()).with_program("/nonexistent/nft");
    let mut lister = NftCli::new(ns.netns());
    // Peers come, and from the third step one goes as well: additions and deletions, every
    // batch on the socket the backend keeps.
    for i in 0..20u8 {
        let mut p = s.pod_by_name(&testkit::pod_ref("t/a")).unwrap().clone();
        p.name = format!("a{i}");
        p.uid = format!("uid-a{i}");
        p.node = Some("n2".into());
        p.ips = vec![format!("198.18.11.{i}").parse().unwrap()];
        s.upsert_pod(p);
        if i >= 2 {
            s.remove_pod(&format!("uid-a{}", i - 2));
        }
        let rs = node_ruleset(&s);
        assert!(flock::apply::element_changes(&prev, &rs).is_some_and(|c| !c.is_empty()), "step {i}: more than elements changed");
        let out = a.apply(&rs).unwrap();
        assert!(matches!(out, Outcome::Applied { incremental: true, .. }), "{out:?}");
        let listing = lister.list_table().unwrap().unwrap();
        assert_eq!(flock::nft::canonical(&listing).unwrap(), flock::nft::canonical(&rs.to_text()).unwrap());
        prev = rs;
    }
}

/// A peer pod's copy on another node: one more element in the node's peer set.
fn with_remote_peer(s: &Snapshot, name: &str, ip: &str) -> Snapshot {
    let mut s = s.clone();
    let mut p = s.pod_by_name(&testkit::pod_ref("t/a")).unwrap().clone();
    (p.name, p.uid, p.node) = (name.into(), format!("uid-{name}"), Some("n2".into()));
    p.ips = vec![ip.parse().unwrap()];
    s.upsert_pod(p);
    s
}

/// The backend keeps its netfilter socket between element batches, and opens another when
/// the namespace at its path is no longer the one the socket was opened in: a kept socket
/// keeps its namespace alive, so batches on it would go to the old one.
#[test]
fn the_kept_netlink_socket_follows_the_namespace_at_its_path() {
    if !require_root("the_kept_netlink_socket_follows_the_namespace_at_its_path") {
        return;
    }
    let ns = NetnsGuard::new("nlkeep");
    let (s, ..) = two_pods(None);
    let rs1 = node_ruleset(&s);
    let rs2 = node_ruleset(&with_remote_peer(&s, "a2", "198.18.11.2"));
    let (grow, shrink) = (flock::apply::element_changes(&rs1, &rs2).unwrap(), flock::apply::element_changes(&rs2, &rs1).unwrap());
    assert!(!grow.is_empty() && !shrink.is_empty());
    let canonical = |rs: &Ruleset| flock::nft::canonical(&rs.to_text()).unwrap();
    let listed = |ns: &NetnsGuard| flock::nft::canonical(&NftCli::new(ns.netns()).list_table().unwrap().unwrap()).unwrap();

    let mut nft = NftCli::new(ns.netns()).with_program("/nonexistent/nft");
    NftCli::new(ns.netns()).run(&rs1.to_text()).unwrap();
    nft.write_elements(&grow).unwrap();
    assert_eq!(listed(&ns), canonical(&rs2));

    // The namespace is deleted and made again under the same name, with the first table.
    flock::testkit::kernel::run(&["ip", "netns", "del", &ns.name]);
    flock::testkit::kernel::run(&["ip", "netns", "add", &ns.name]);
    NftCli::new(ns.netns()).run(&rs1.to_text()).unwrap();
    nft.write_elements(&grow).unwrap();
    assert_eq!(listed(&ns), canonical(&rs2), "the batch did not reach the namespace now at the path");
    nft.write_elements(&shrink).unwrap();
    assert_eq!(listed(&ns), canonical(&rs1));
}

/// An agent restarted on a node whose table holds the overlay's sets (keyed by a raw payload:
/// `ip saddr . @th,336,32`, which nft lists as type `integer`) reads the table back and
/// updates it. Found on the real cluster (tests/cluster): a replaced flock-agent pod under
/// `--routing auto` failed every sync with `unexpected JSON from nft: set: …`, and never
/// became ready.
#[test]
fn a_restarted_applier_takes_over_a_table_with_the_overlays_sets() {
    if !require_root("a_restarted_applier_takes_over_a_table_with_the_overlays_sets") {
        return;
    }
    let ns = NetnsGuard::new("adopt-ovl");
    let overlay = Options { overlay_port: Some(4789), ..Options::default() };
    let render_of = |s: &Snapshot| render(&translate(s, &s.derived_endpoints("node-1"), &overlay));
    let before = render_of(&snapshot(false));
    assert!(before.to_text().contains("@th,336,32"), "the render has no overlay set:\n{}", before.to_text());
    Applier::new(NftCli::new(ns.netns())).apply(&before).unwrap();

    // The restart: a new process, nothing known of the table but what the kernel says.
    let mut restarted = Applier::new(NftCli::new(ns.netns()));
    let names: Vec<String> = restarted.backend_mut().list_objects().unwrap().into_iter().map(|o| o.name).collect();
    assert!(names.iter().any(|n| n == "overlay-v4-in-v4"), "the overlay's set is not listed: {names:?}");
    // What changed while it was away (policies were added) is written in one transaction.
    let after = render_of(&snapshot(true));
    assert!(matches!(restarted.apply(&after).unwrap(), Outcome::Applied { .. }));
    let listing = restarted.backend_mut().list_table().unwrap().unwrap();
    assert_eq!(flock::nft::canonical(&listing).unwrap(), flock::nft::canonical(&after.to_text()).unwrap(), "kernel listing:\n{listing}");
    assert_eq!(restarted.apply(&after).unwrap(), Outcome::Unchanged);

    // And a second restart with nothing changed finds its own table.
    let mut again = Applier::new(NftCli::new(ns.netns()));
    assert_eq!(again.apply(&after).unwrap(), Outcome::Unchanged, "a restart with nothing changed rewrote the table");
    assert_eq!(again.check_drift().unwrap(), Drift::InSync);
}
