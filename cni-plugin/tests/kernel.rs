//! flock-cni on a real kernel, run exactly as a runtime runs it (environment + stdin, through
//! `flock_cni::runtime`, inside a "node" network namespace) against a fake agent on a
//! temporary socket, with Debian's host-local and loopback plugins. Root only; everything is
//! created in throwaway namespaces and temporary directories, and cleaned up on drop.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flock_cni::protocol::{Reply, Request};
use flock_cni::runtime::{ConfList, Runtime, Sandbox};
use flock_cni::spec::{Attachment, code};
use flock_cni::testing::{FakeAgent, Forged, NetnsGuard, TempDir, forge_neighbour_requests, neighbours_of, require_root};
use flock_cni::{host_interface_name, netns};
use serde_json::{Value, json};

const DEBIAN_CNI: &str = "/usr/lib/cni";

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_flock-cni")).parent().unwrap().to_path_buf()
}

/// A node namespace, a temp dir for sockets, state and leases, and a conflist.
struct Fixture {
    node: NetnsGuard,
    dir: TempDir,
    runtime: Runtime,
    subnet4: &'static str,
}

impl Fixture {
    fn new(tag: &str, subnet4: &'static str) -> Self {
        let node = NetnsGuard::new(tag);
        // A default route, as real nodes have.
        node.ip(&["link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer"]);
        node.ip(&["link", "set", "uplink", "up"]);
        node.ip(&["link", "set", "uplink-peer", "up"]);
        node.ip(&["route", "add", "default", "dev", "uplink"]);
        let dir = TempDir::new(tag);
        let runtime = Runtime { cni_path: vec![plugin_dir(), PathBuf::from(DEBIAN_CNI)], netns: node.netns() };
        Self { node, dir, runtime, subnet4 }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("cni.sock")
    }

    fn flock_plugin(&self, ranges: Value) -> Value {
        json!({
            "type": "flock-cni",
            "agentSocket": self.socket(),
            "agentTimeoutSeconds": 5,
            "pendingDelDir": self.dir.join("pending-del"),
            "stateDir": self.dir.join("state"),
            "mtu": 1400,
            "capabilities": {"ips": true},
            "ipam": {"type": "host-local", "dataDir": self.dir.join("ipam"), "ranges": ranges}
        })
    }

    fn conf(&self, version: &str) -> ConfList {
        self.conf_with(version, json!([[{"subnet": self.subnet4}]]), false)
    }

    fn conf_with(&self, version: &str, ranges: Value, loopback: bool) -> ConfList {
        let mut plugins = vec![];
        if loopback {
            plugins.push(json!({"type": "loopback"}));
        }
        plugins.push(self.flock_plugin(ranges));
        ConfList::parse(&json!({"cniVersion": version, "name": "flock-test", "plugins": plugins}).to_string()).unwrap()
    }

    fn sandbox(&self, pod: &NetnsGuard, name: &str) -> Sandbox {
        Sandbox::for_pod(&format!("cid-{name}"), &format!("/run/netns/{}", pod.name), "default", name, Some(&format!("uid-{name}")))
    }

    /// Lease files held by host-local.
    fn leases(&self) -> Vec<String> {
        let d = self.dir.join("ipam/flock-test");
        let mut v: Vec<String> = std::fs::read_dir(&d)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.contains('.') || n.contains(':'))
                    .filter(|n| !n.starts_with("last_reserved") && n != "lock")
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn host_link_exists(&self, name: &str) -> bool {
        self.node.try_exec(&["ip", "link", "show", name]).status.success()
    }
}

fn pod_ip(result: &Value, family4: bool) -> IpAddr {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap().split('/').next().unwrap().parse::<IpAddr>().unwrap())
        .find(|a| a.is_ipv4() == family4 && !a.is_loopback())
        .unwrap()
}

fn ping(from: &NetnsGuard, to: IpAddr) -> bool {
    let v6 = if to.is_ipv6() { "-6" } else { "-4" };
    from.try_exec(&["ping", v6, "-c", "1", "-W", "1", &to.to_string()]).status.success()
}

#[test]
fn add_wires_pods_that_reach_each_other_then_del_removes_everything() {
    if !require_root("add_wires_pods_that_reach_each_other_then_del_removes_everything") {
        return;
    }
    let f = Fixture::new("add", "198.18.50.0/24");
    let agent = FakeAgent::acking(&f.socket());
    // Debian's host-local stops at 1.0.0, so the chain says 1.0.0 (flock-cni speaks 1.1.0).
    let conf = f.conf("1.0.0");
    let (pa, pb) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"));
    let (sa, sb) = (f.sandbox(&pa, "a"), f.sandbox(&pb, "b"));
    let ra = f.runtime.add(&conf, &sa).unwrap();
    let rb = f.runtime.add(&conf, &sb).unwrap();

    // The result: host and sandbox interfaces, the /32 with the link-local gateway.
    assert_eq!(ra["cniVersion"], "1.0.0");
    assert_eq!(ra["interfaces"][0]["name"], host_interface_name("cid-a", "eth0"));
    assert_eq!(ra["interfaces"][1]["name"], "eth0");
    assert_eq!(ra["interfaces"][1]["sandbox"], format!("/run/netns/{}", pa.name));
    assert!(ra["ips"][0]["address"].as_str().unwrap().ends_with("/32"));
    assert_eq!(ra["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(ra["ips"][0]["interface"], 1);
    assert_eq!(ra["routes"][0]["dst"], "0.0.0.0/0");
    assert!(ra["interfaces"][1].get("mtu").is_none(), "mtu is a 1.1 field");
    let mtu = String::from_utf8_lossy(&pa.exec(&["cat", "/sys/class/net/eth0/mtu"]).stdout).trim().to_string();
    assert_eq!(mtu, "1400");

    // The agent was told who the pod is, before ADD returned.
    let seen = agent.seen();
    let Request::Add(add) = &seen[0] else { panic!("{seen:?}") };
    assert_eq!((add.pod.namespace.as_str(), add.pod.name.as_str(), add.pod.uid.as_deref()), ("default", "a", Some("uid-a")));
    assert_eq!(add.host_interface, host_interface_name("cid-a", "eth0"));
    assert_eq!(add.ips, vec![pod_ip(&ra, true)]);

    // Routed through the node: ping and TCP.
    let (a, b) = (pod_ip(&ra, true), pod_ip(&rb, true));
    assert!(ping(&pa, b), "a cannot ping b");
    assert!(ping(&pb, a), "b cannot ping a");
    let listener = netns::run_in(&pb.netns(), || TcpListener::bind(SocketAddr::new(b, 7070))).unwrap().unwrap();
    let server = std::thread::spawn(move || listener.accept().map(|(mut s, _)| std::io::copy(&mut s, &mut std::io::sink())).is_ok());
    let addr = SocketAddr::new(b, 7070);
    let conn = netns::run_in(&pa.netns(), || TcpStream::connect_timeout(&addr, Duration::from_secs(2))).unwrap();
    assert!(conn.is_ok(), "TCP a → b: {conn:?}");
    drop(conn);
    assert!(server.join().unwrap());

    // CHECK passes right after ADD.
    f.runtime.check(&conf, &sa, &ra).unwrap();

    // DEL removes the interfaces, the lease, the record; the agent hears of it.
    assert_eq!(f.leases().len(), 2);
    f.runtime.del(&conf, &sa, Some(&ra)).unwrap();
    f.runtime.del(&conf, &sb, Some(&rb)).unwrap();
    assert!(!f.host_link_exists(&host_interface_name("cid-a", "eth0")));
    assert!(!pa.try_exec(&["ip", "link", "show", "eth0"]).status.success());
    assert!(f.leases().is_empty(), "{:?}", f.leases());
    assert!(agent.seen().iter().any(|r| matches!(r, Request::Del(d) if d.container_id == "cid-a")));
    assert!(std::fs::read_dir(f.dir.join("state/flock-test")).unwrap().next().is_none());
}

#[test]
fn add_on_an_existing_interface_fails_without_leaking_a_lease() {
    if !require_root("add_on_an_existing_interface_fails_without_leaking_a_lease") {
        return;
    }
    let f = Fixture::new("exists", "198.18.51.0/24");
    let _agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");
    let pod = NetnsGuard::new("p");
    // Another plugin already made eth0 in the pod.
    pod.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "other0"]);
    let e = f.runtime.add(&conf, &f.sandbox(&pod, "x")).unwrap_err();
    assert_eq!(e.code, code::INTERFACE_EXISTS, "{e}");
    assert!(f.leases().is_empty(), "IPAM not rolled back: {:?}", f.leases());
    assert!(!f.host_link_exists(&host_interface_name("cid-x", "eth0")));

    // The same attachment ADDed twice: the second fails and the first keeps its lease.
    let pod2 = NetnsGuard::new("p2");
    let sb = f.sandbox(&pod2, "y");
    let r = f.runtime.add(&conf, &sb).unwrap();
    let e = f.runtime.add(&conf, &sb).unwrap_err();
    assert_eq!(e.code, code::INTERFACE_EXISTS, "{e}");
    assert_eq!(f.leases().len(), 1);
    // The first attachment is intact.
    f.runtime.check(&conf, &sb, &r).unwrap();
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
}

#[test]
fn check_fails_when_the_host_route_is_gone() {
    if !require_root("check_fails_when_the_host_route_is_gone") {
        return;
    }
    let f = Fixture::new("check", "198.18.52.0/24");
    let agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");
    let pod = NetnsGuard::new("p");
    let sb = f.sandbox(&pod, "c");
    let r = f.runtime.add(&conf, &sb).unwrap();
    f.runtime.check(&conf, &sb, &r).unwrap();
    assert!(agent.seen().iter().any(|q| matches!(q, Request::Check(_))));
    f.node.ip(&["route", "del", &format!("{}/32", pod_ip(&r, true))]);
    let e = f.runtime.check(&conf, &sb, &r).unwrap_err();
    assert_eq!(e.code, code::CHECK_FAILED, "{e}");
    assert!(e.msg.contains("host route"), "{e}");
    // An address removed in the pod is found too.
    f.node.ip(&["route", "add", &format!("{}/32", pod_ip(&r, true)), "dev", &host_interface_name("cid-c", "eth0")]);
    f.runtime.check(&conf, &sb, &r).unwrap();
    pod.ip(&["addr", "flush", "dev", "eth0"]);
    let e = f.runtime.check(&conf, &sb, &r).unwrap_err();
    assert!(e.msg.contains("address"), "{e}");
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
}

#[test]
fn del_is_idempotent_and_needs_neither_netns_nor_prev_result() {
    if !require_root("del_is_idempotent_and_needs_neither_netns_nor_prev_result") {
        return;
    }
    let f = Fixture::new("del", "198.18.53.0/24");
    let _agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");

    let p1 = NetnsGuard::new("p1");
    let s1 = f.sandbox(&p1, "one");
    let r1 = f.runtime.add(&conf, &s1).unwrap();
    f.runtime.del(&conf, &s1, Some(&r1)).unwrap();
    f.runtime.del(&conf, &s1, None).unwrap(); // repeated, no prevResult (libcni's cache is gone)

    // The netns vanished before DEL.
    let p2 = NetnsGuard::new("p2");
    let s2 = f.sandbox(&p2, "two");
    let r2 = f.runtime.add(&conf, &s2).unwrap();
    drop(p2);
    f.runtime.del(&conf, &s2, Some(&r2)).unwrap();

    // Empty CNI_NETNS and no prevResult.
    let p3 = NetnsGuard::new("p3");
    let s3 = f.sandbox(&p3, "three");
    f.runtime.add(&conf, &s3).unwrap();
    let mut gone = s3.clone();
    gone.netns = String::new();
    f.runtime.del(&conf, &gone, None).unwrap();
    assert!(!f.host_link_exists(&host_interface_name("cid-three", "eth0")));
    assert!(f.leases().is_empty(), "{:?}", f.leases());
}

#[test]
fn agent_down_add_fails_11_del_spools_check_11_status_50() {
    if !require_root("agent_down_add_fails_11_del_spools_check_11_status_50") {
        return;
    }
    let f = Fixture::new("down", "198.18.54.0/24");
    let conf = f.conf("1.0.0");
    let pod = NetnsGuard::new("p");
    let sb = f.sandbox(&pod, "d");

    // No agent: ADD fails with 11 and leaves nothing behind.
    let e = f.runtime.add(&conf, &sb).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(!f.host_link_exists(&host_interface_name("cid-d", "eth0")));
    assert!(!pod.try_exec(&["ip", "link", "show", "eth0"]).status.success());
    assert!(f.leases().is_empty());

    // An agent that refuses: same.
    {
        let _refusing = FakeAgent::start(&f.socket(), Arc::new(|_| Reply::refused("pod unknown")));
        let e = f.runtime.add(&conf, &sb).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert!(e.details.contains("pod unknown"), "{e:?}");
        assert!(f.leases().is_empty());
    }

    // With the agent up the pod is added; then the agent goes away.
    let r = {
        let _agent = FakeAgent::acking(&f.socket());
        f.runtime.add(&conf, &sb).unwrap()
    };
    let e = f.runtime.check(&conf, &sb, &r).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    let e = f.runtime.status(&conf).unwrap_err();
    assert_eq!(e.code, code::NOT_AVAILABLE, "{e}");
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
    let spooled = flock_cni::protocol::spool_path(&f.dir.join("pending-del"), "cid-d", "eth0");
    assert!(spooled.exists());
    let spool = flock_cni::protocol::read_spool(&f.dir.join("pending-del")).unwrap();
    assert_eq!(spool.len(), 1);
    assert_eq!(spool[0].1.as_ref().unwrap().host_interface, host_interface_name("cid-d", "eth0"));
    assert!(f.leases().is_empty());

    let _agent = FakeAgent::acking(&f.socket());
    f.runtime.status(&conf).unwrap();
}

#[test]
fn gc_removes_stale_links_records_and_leases() {
    if !require_root("gc_removes_stale_links_records_and_leases") {
        return;
    }
    let f = Fixture::new("gc", "198.18.55.0/24");
    let agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");
    let (pa, pb) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"));
    let (sa, sb) = (f.sandbox(&pa, "keep"), f.sandbox(&pb, "stale"));
    f.runtime.add(&conf, &sa).unwrap();
    f.runtime.add(&conf, &sb).unwrap();
    // A flock interface no record explains (an ADD that crashed half-way).
    let ghost = host_interface_name("ghost", "eth0");
    f.node.ip(&["link", "add", &ghost, "type", "veth", "peer", "name", "ghost-peer"]);
    assert_eq!(f.leases().len(), 2);

    f.runtime.gc(&conf, &[Attachment { container_id: "cid-keep".into(), ifname: "eth0".into() }]).unwrap();
    assert!(f.host_link_exists(&host_interface_name("cid-keep", "eth0")));
    assert!(!f.host_link_exists(&host_interface_name("cid-stale", "eth0")));
    assert!(!f.host_link_exists(&ghost));
    assert_eq!(f.leases().len(), 1, "the stale lease was not released: {:?}", f.leases());
    let seen = agent.seen();
    assert!(seen.iter().any(|r| matches!(r, Request::Del(d) if d.container_id == "cid-stale")), "{seen:?}");
    assert!(seen.iter().any(|r| matches!(r, Request::Gc(g) if g.valid.len() == 1)), "{seen:?}");
    f.runtime.del(&conf, &sa, None).unwrap();
}

#[test]
fn twenty_parallel_adds() {
    if !require_root("twenty_parallel_adds") {
        return;
    }
    let f = Fixture::new("par", "198.18.56.0/24");
    let _agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");
    let pods: Vec<NetnsGuard> = (0..20).map(|i| NetnsGuard::new(&format!("p{i}"))).collect();
    let results: Vec<Result<Value, _>> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (f, conf) = (&f, &conf);
                s.spawn(move || f.runtime.add(conf, &f.sandbox(p, &format!("par{i}"))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ips: Vec<IpAddr> = results.iter().map(|r| pod_ip(r.as_ref().unwrap(), true)).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 20);
    assert!(ping(&pods[0], ips[19]) || ping(&pods[0], ips[0]));
    for (i, p) in pods.iter().enumerate() {
        f.runtime.del(&conf, &f.sandbox(p, &format!("par{i}")), None).unwrap();
    }
    assert!(f.leases().is_empty());
}

#[test]
fn dual_stack_add() {
    if !require_root("dual_stack_add") {
        return;
    }
    let f = Fixture::new("dual", "198.18.57.0/24");
    let _agent = FakeAgent::acking(&f.socket());
    let conf = f.conf_with("1.0.0", json!([[{"subnet": "198.18.57.0/24"}], [{"subnet": "2001:db8:57::/64"}]]), false);
    let (pa, pb) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"));
    let ra = f.runtime.add(&conf, &f.sandbox(&pa, "a")).unwrap();
    let rb = f.runtime.add(&conf, &f.sandbox(&pb, "b")).unwrap();
    assert_eq!(ra["ips"].as_array().unwrap().len(), 2);
    let v6 = pod_ip(&ra, false);
    assert!(ra["ips"][1]["address"].as_str().unwrap().ends_with("/128"));
    assert_eq!(ra["ips"][1]["gateway"], "fe80::1");
    assert!(ra["routes"].as_array().unwrap().iter().any(|r| r["dst"] == "::/0"));
    assert!(ping(&pb, v6), "IPv6 b → a");
    assert!(ping(&pa, pod_ip(&rb, true)), "IPv4 a → b");
    f.runtime.del(&conf, &f.sandbox(&pa, "a"), Some(&ra)).unwrap();
    f.runtime.del(&conf, &f.sandbox(&pb, "b"), Some(&rb)).unwrap();
    assert!(f.leases().is_empty());
}

/// The attacker in the pod, with no flock table on the node: floods of ARP requests (for
/// the gateway and for the node's address) and of IPv6 neighbour solicitations (from off-link
/// globals and from link-locals, hop limit 255), every sender forged. On a host side with
/// ARP on — how flock-cni wired pods before — the flood becomes neighbour entries of the
/// node (checked, so the test can fail); on what flock-cni wires (ARP off, permanent
/// neighbours on both ends) none does, and the pod still reaches the node and the other pod
/// in both families. CHECK names a missing permanent neighbour.
#[test]
fn forged_arp_and_solicitations_teach_the_node_no_neighbour() {
    if !require_root("forged_arp_and_solicitations_teach_the_node_no_neighbour") {
        return;
    }
    let f = Fixture::new("nbr", "198.18.58.0/24");
    f.node.ip(&["addr", "add", "198.18.58.254/32", "dev", "uplink"]);
    f.node.ip(&["-6", "addr", "add", "2001:db8:58::fffe/128", "dev", "uplink", "nodad"]);
    let _agent = FakeAgent::acking(&f.socket());
    let conf = f.conf_with("1.0.0", json!([[{"subnet": "198.18.58.0/24"}], [{"subnet": "2001:db8:58::/64"}]]), false);
    let (pa, pb, pc) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"), NetnsGuard::new("pc"));
    let (sa, sb, sc) = (f.sandbox(&pa, "a"), f.sandbox(&pb, "b"), f.sandbox(&pc, "c"));
    let ra = f.runtime.add(&conf, &sa).unwrap();
    let rb = f.runtime.add(&conf, &sb).unwrap();
    let rc = f.runtime.add(&conf, &sc).unwrap();
    let forged = ["198.18.200.", "2001:db8:ee::", "fe80::ee"];
    let flood = |pod: &NetnsGuard| {
        forge_neighbour_requests(pod, Forged::Arp { target: "169.254.1.1" }, 100);
        forge_neighbour_requests(pod, Forged::Arp { target: "198.18.58.254" }, 100);
        forge_neighbour_requests(pod, Forged::Solicitation { prefix: "2001:db8:ee::", hop: 255 }, 100);
        forge_neighbour_requests(pod, Forged::Solicitation { prefix: "fe80::ee00", hop: 255 }, 100);
        std::thread::sleep(Duration::from_millis(200));
    };

    // c's host side with ARP on: the flood is learnt.
    let (host_a, host_c) = (host_interface_name("cid-a", "eth0"), host_interface_name("cid-c", "eth0"));
    f.node.ip(&["link", "set", "dev", &host_c, "arp", "on"]);
    // The control only has to show that the flood can work: the kernel does not learn from
    // every forged solicitation right after the flag changes (CI once saw the 100 ARP
    // entries and none of ND), so it gets up to three floods.
    let mut learnt = Vec::new();
    for _ in 0..3 {
        flood(&pc);
        learnt = neighbours_of(&f.node, &host_c, &forged);
        if learnt.len() >= 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(learnt.len() >= 200, "the attack did not work with ARP on: {learnt:?}");

    // a as flock-cni wired it: nothing is learnt.
    let host = String::from_utf8_lossy(&f.node.ip(&["link", "show", "dev", &host_a]).stdout).into_owned();
    assert!(host.contains("NOARP"), "{host}");
    flood(&pa);
    let learnt = neighbours_of(&f.node, &host_a, &forged);
    assert!(learnt.is_empty(), "forged senders became neighbour entries: {learnt:?}");
    // The node's entries for a: its two addresses and its link-local one, all permanent,
    // with the pod side's MAC; a's for its gateways, with the host side's. Both MACs were
    // set at creation (udev rewrites random ones).
    let pod_mac = String::from_utf8_lossy(&pa.exec(&["cat", "/sys/class/net/eth0/address"]).stdout).trim().to_string();
    let mut permanent = neighbours_of(&f.node, &host_a, &[""]);
    permanent.retain(|n| n.contains("PERMANENT"));
    assert_eq!(permanent.len(), 3, "{permanent:?}");
    assert!(permanent.iter().all(|n| n.contains(&pod_mac)), "{permanent:?} {pod_mac}");
    assert!(permanent.iter().any(|n| n.starts_with("fe80::")), "{permanent:?}");
    let gateways = neighbours_of(&pa, "eth0", &["169.254.1.1", "fe80::1 "]);
    assert!(gateways.len() == 2 && gateways.iter().all(|n| n.contains("PERMANENT") && n.contains("ee:ee:ee:ee:ee:ee")), "{gateways:?}");
    for (ns, dev) in [(&f.node, host_a.as_str()), (&pa, "eth0")] {
        let assign =
            String::from_utf8_lossy(&ns.exec(&["cat", &format!("/sys/class/net/{dev}/addr_assign_type")]).stdout).trim().to_string();
        assert_eq!(assign, "3", "{dev}: the MAC was set, not random (NET_ADDR_SET)");
    }
    // a reaches the node's link-local address from its own (the reply needs the entry).
    assert!(pa.try_exec(&["ping", "-6", "-c", "1", "-W", "1", "fe80::1%eth0"]).status.success(), "a → fe80::1");

    // a still reaches the node and b, both families.
    for to in ["198.18.58.254".parse().unwrap(), "2001:db8:58::fffe".parse().unwrap(), pod_ip(&rb, true), pod_ip(&rb, false)] {
        assert!(ping(&pa, to), "a cannot reach {to}");
    }
    assert!(ping(&pb, pod_ip(&ra, false)), "b cannot reach a over IPv6");

    // CHECK notices a missing permanent neighbour on either end.
    f.runtime.check(&conf, &sa, &ra).unwrap();
    pa.ip(&["neigh", "del", "169.254.1.1", "dev", "eth0"]);
    let e = f.runtime.check(&conf, &sa, &ra).unwrap_err();
    assert!(e.to_string().contains("the gateway's permanent neighbour 169.254.1.1"), "{e}");
    let a4 = pod_ip(&ra, true).to_string();
    f.node.ip(&["neigh", "del", &a4, "dev", &host_a]);
    let e = f.runtime.check(&conf, &sa, &ra).unwrap_err();
    assert!(e.to_string().contains(&format!("permanent neighbour {a4}")), "{e}");

    for (sb_, r) in [(&sa, &ra), (&sb, &rb), (&sc, &rc)] {
        f.runtime.del(&conf, sb_, Some(r)).unwrap();
    }
    assert!(f.leases().is_empty());
}

#[test]
fn interop_with_debian_loopback_and_host_local_across_versions() {
    if !require_root("interop_with_debian_loopback_and_host_local_across_versions") {
        return;
    }
    let f = Fixture::new("interop", "198.18.58.0/24");
    let _agent = FakeAgent::acking(&f.socket());
    for (i, version) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"].iter().enumerate() {
        let conf = f.conf_with(version, json!([[{"subnet": "198.18.58.0/24"}]]), true);
        let pod = NetnsGuard::new("p");
        let mut sb = f.sandbox(&pod, &format!("v{i}"));
        // Requested addresses pass through to host-local: CNI_ARGS IP= and the ips capability.
        let wanted: IpAddr = format!("198.18.58.{}", 100 + i).parse().unwrap();
        if i % 2 == 0 {
            sb.args.push(("IP".into(), wanted.to_string()));
        } else {
            sb.capability_args.insert("ips".into(), json!([format!("{wanted}/24")]));
        }
        let r = f.runtime.add(&conf, &sb).unwrap();
        assert_eq!(r["cniVersion"], *version);
        assert_eq!(pod_ip(&r, true), wanted, "{version}");
        // Old versions carry ips[].version; loopback's lo comes first in the chain's result.
        assert_eq!(r["ips"].as_array().unwrap().iter().any(|ip| ip.get("version").is_some()), version.starts_with("0."));
        assert!(r["interfaces"].as_array().unwrap().iter().any(|i| i["name"] == "lo"));
        assert!(pod.exec(&["ip", "-br", "link", "show", "lo"]).stdout.windows(7).any(|w| w == b"UNKNOWN" || w.starts_with(b"UP")));
        if *version != "0.3.0" && *version != "0.3.1" {
            f.runtime.check(&conf, &sb, &r).unwrap();
        } else {
            // CHECK does not exist before 0.4.0.
            assert_eq!(f.runtime.check(&conf, &sb, &r).unwrap_err().code, code::INCOMPATIBLE_VERSION);
        }
        f.runtime.del(&conf, &sb, Some(&r)).unwrap();
    }
    // Debian's plugins stop at 1.0.0: a 1.1.0 chain fails at them, not at flock-cni.
    let conf = f.conf_with("1.1.0", json!([[{"subnet": "198.18.58.0/24"}]]), false);
    let pod = NetnsGuard::new("p");
    let e = f.runtime.add(&conf, &f.sandbox(&pod, "v11")).unwrap_err();
    assert!(e.msg.starts_with("flock-cni ADD: host-local"), "{e}");
    assert!(f.leases().is_empty());
}

/// The attachment records of the fixture's network.
fn records(f: &Fixture) -> Vec<flock_cni::state::Record> {
    flock_cni::state::list(&f.dir.join("state/flock-test")).unwrap()
}

/// The DELs waiting in the fixture's spool.
fn spooled(f: &Fixture) -> Vec<flock_cni::protocol::DelRequest> {
    flock_cni::protocol::read_spool(&f.dir.join("pending-del")).unwrap().into_iter().map(|(_, d)| d.unwrap()).collect()
}

#[test]
fn container_ids_of_1024_characters_work_for_add_check_del_and_the_spool() {
    if !require_root("container_ids_of_1024_characters_work_for_add_check_del_and_the_spool") {
        return;
    }
    let f = Fixture::new("long", "198.18.59.0/24");
    let conf = f.conf("1.0.0");
    let pod = NetnsGuard::new("p");
    let mut sb = f.sandbox(&pod, "long");
    sb.container_id = "c".repeat(1024);
    let host_if = host_interface_name(&sb.container_id, "eth0");

    // Agent up: ADD, CHECK, DEL; the record exists between ADD and DEL.
    let r = {
        let agent = FakeAgent::acking(&f.socket());
        let r = f.runtime.add(&conf, &sb).unwrap();
        assert_eq!(records(&f).iter().map(|r| r.container_id.len()).collect::<Vec<_>>(), vec![1024]);
        f.runtime.check(&conf, &sb, &r).unwrap();
        f.runtime.del(&conf, &sb, Some(&r)).unwrap();
        assert!(agent.seen().iter().any(|q| matches!(q, Request::Del(d) if d.container_id == sb.container_id)));
        assert!(!f.host_link_exists(&host_if));
        assert!(records(&f).is_empty());
        assert!(f.leases().is_empty(), "{:?}", f.leases());
        f.runtime.add(&conf, &sb).unwrap()
    };
    // Agent down: DEL is spooled under a name the file system takes.
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
    let spool = spooled(&f);
    assert_eq!(spool.len(), 1);
    assert_eq!((spool[0].container_id.as_str(), spool[0].host_interface.as_str()), (sb.container_id.as_str(), host_if.as_str()));
    assert!(records(&f).is_empty());
    assert!(f.leases().is_empty(), "{:?}", f.leases());
}

#[test]
fn attachments_whose_old_file_names_collide_are_kept_apart() {
    if !require_root("attachments_whose_old_file_names_collide_are_kept_apart") {
        return;
    }
    // ("cid-a-b", "c") and ("cid-a", "b-c") were both "cid-a-b-c.json".
    let f = Fixture::new("collide", "198.18.60.0/24");
    let conf = f.conf("1.0.0");
    let (px, py) = (NetnsGuard::new("px"), NetnsGuard::new("py"));
    let mut x = f.sandbox(&px, "x");
    (x.container_id, x.ifname) = ("cid-a-b".into(), "c".into());
    let mut y = f.sandbox(&py, "y");
    (y.container_id, y.ifname) = ("cid-a".into(), "b-c".into());
    let (hx, hy) = (host_interface_name("cid-a-b", "c"), host_interface_name("cid-a", "b-c"));

    // Agent down at DEL: both DELs wait in the spool.
    let (rx, ry) = {
        let _agent = FakeAgent::acking(&f.socket());
        (f.runtime.add(&conf, &y).unwrap(), f.runtime.add(&conf, &x).unwrap())
    };
    assert_eq!(records(&f).len(), 2);
    f.runtime.del(&conf, &y, Some(&ry)).unwrap();
    f.runtime.del(&conf, &x, Some(&rx)).unwrap();
    let mut spooled_ifs: Vec<String> = spooled(&f).into_iter().map(|d| d.host_interface).collect();
    spooled_ifs.sort();
    let mut want = vec![hx.clone(), hy.clone()];
    want.sort();
    assert_eq!(spooled_ifs, want);

    // GC keeps x and collects y, releasing y's lease from y's own record.
    let agent = FakeAgent::acking(&f.socket());
    f.runtime.add(&conf, &y).unwrap();
    let rx = f.runtime.add(&conf, &x).unwrap();
    f.runtime.gc(&conf, &[Attachment { container_id: "cid-a-b".into(), ifname: "c".into() }]).unwrap();
    assert!(f.host_link_exists(&hx));
    assert!(!f.host_link_exists(&hy));
    assert_eq!(f.leases().len(), 1, "y's lease was not released: {:?}", f.leases());
    assert_eq!(records(&f).iter().map(|r| r.host_interface.clone()).collect::<Vec<_>>(), vec![hx.clone()]);
    assert!(agent.seen().iter().any(|q| matches!(q, Request::Del(d) if d.host_interface == hy)));
    f.runtime.del(&conf, &x, Some(&rx)).unwrap();
    assert!(f.leases().is_empty(), "{:?}", f.leases());
}

/// An agent that takes ADDs and answers them only once the test says so (never within the
/// plugin's timeout: the plugin has given up by then), running `on_add` when an ADD arrives;
/// everything else is acknowledged at once.
fn stalling_agent(socket: &Path, on_add: impl Fn() + Send + Sync + 'static) -> (FakeAgent, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let agent = FakeAgent::start(
        socket,
        Arc::new(move |q: &Request| {
            if matches!(q, Request::Add(_)) {
                on_add();
                let until = std::time::Instant::now() + Duration::from_secs(60);
                while !r.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Reply::ok()
        }),
    );
    (agent, release)
}

/// ADD against an agent that takes the request, then goes away (its socket moved aside —
/// not removed: the fake agent needs it back to stop) without answering; the ADD's error.
fn add_while_the_agent_leaves(f: &Fixture, conf: &ConfList, sb: &Sandbox) -> flock_cni::spec::CniError {
    let (socket, hidden) = (f.socket(), f.dir.join("hidden.sock"));
    let (_agent, release) = stalling_agent(&f.socket(), move || std::fs::rename(&socket, &hidden).unwrap());
    let e = f.runtime.add(conf, sb).unwrap_err();
    std::fs::rename(f.dir.join("hidden.sock"), f.socket()).unwrap();
    release.store(true, std::sync::atomic::Ordering::Relaxed);
    e
}

#[test]
fn an_add_the_agent_did_not_answer_in_time_is_withdrawn_from_it() {
    if !require_root("an_add_the_agent_did_not_answer_in_time_is_withdrawn_from_it") {
        return;
    }
    use std::sync::atomic::Ordering;
    let f = Fixture::new("late", "198.18.61.0/24");
    let mut conf = f.conf("1.0.0");
    conf.plugins[0].insert("agentTimeoutSeconds".into(), json!(1));
    let pod = NetnsGuard::new("p");

    // The agent is still there after the timeout: the DEL goes to it.
    let sb = f.sandbox(&pod, "late");
    let host_if = host_interface_name("cid-late", "eth0");
    {
        let (agent, release) = stalling_agent(&f.socket(), || {});
        let e = f.runtime.add(&conf, &sb).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert!(e.details.contains("did not answer"), "{e:?}");
        let seen = agent.seen();
        assert!(
            seen.iter().any(|q| matches!(q, Request::Del(d) if d.host_interface == host_if && d.container_id == "cid-late")),
            "{seen:?}"
        );
        release.store(true, Ordering::Relaxed);
    }
    assert!(!f.host_link_exists(&host_if));
    assert!(f.leases().is_empty(), "{:?}", f.leases());
    assert!(records(&f).is_empty());
    assert!(spooled(&f).is_empty());

    // The agent went away after taking the ADD: the DEL waits in the spool for it.
    let sb = f.sandbox(&pod, "gone");
    let host_if = host_interface_name("cid-gone", "eth0");
    let e = add_while_the_agent_leaves(&f, &conf, &sb);
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    let spool = spooled(&f);
    assert_eq!(spool.iter().map(|d| d.host_interface.as_str()).collect::<Vec<_>>(), vec![host_if.as_str()]);
    assert_eq!(spool[0].pod.as_ref().map(|p| p.name.as_str()), Some("gone"));
    assert!(!f.host_link_exists(&host_if));
    assert!(f.leases().is_empty(), "{:?}", f.leases());

    // An agent that refused the ADD (it registers before the sync that failed) hears a DEL.
    let sb = f.sandbox(&pod, "refused");
    let agent = FakeAgent::start(
        &f.socket(),
        Arc::new(|q: &Request| match q {
            Request::Add(_) => Reply::refused("the sync failed"),
            _ => Reply::ok(),
        }),
    );
    let e = f.runtime.add(&conf, &sb).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(agent.seen().iter().any(|q| matches!(q, Request::Del(d) if d.container_id == "cid-refused")));
    assert!(f.leases().is_empty(), "{:?}", f.leases());
}

#[test]
fn a_lease_is_released_only_once_the_agent_is_told() {
    if !require_root("a_lease_is_released_only_once_the_agent_is_told") {
        return;
    }
    let f = Fixture::new("told", "198.18.63.0/24");
    let conf = f.conf("1.0.0");
    // The same network, but nowhere to spool: its path is a file.
    std::fs::write(f.dir.join("blocked"), "").unwrap();
    let mut blocked = conf.clone();
    blocked.plugins[0].insert("pendingDelDir".into(), json!(f.dir.join("blocked")));
    blocked.plugins[0].insert("agentTimeoutSeconds".into(), json!(1));
    let pod = NetnsGuard::new("p");

    // DEL with the agent down and no spool fails and keeps the lease and the record (the
    // runtime retries); a DEL that can spool releases them.
    let sb = f.sandbox(&pod, "del");
    let r = {
        let _agent = FakeAgent::acking(&f.socket());
        f.runtime.add(&conf, &sb).unwrap()
    };
    let e = f.runtime.del(&blocked, &sb, Some(&r)).unwrap_err();
    assert_eq!(e.code, code::STATE, "{e}");
    assert_eq!(f.leases().len(), 1);
    assert_eq!(records(&f).len(), 1);
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
    assert!(f.leases().is_empty(), "{:?}", f.leases());
    assert!(records(&f).is_empty());

    // An ADD whose endpoint cannot be withdrawn keeps its lease and record for the DEL.
    let sb = f.sandbox(&pod, "add");
    let e = add_while_the_agent_leaves(&f, &blocked, &sb);
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(e.details.contains("cannot be queued"), "{e:?}");
    assert!(!f.host_link_exists(&host_interface_name("cid-add", "eth0")));
    assert_eq!(f.leases().len(), 1);
    assert_eq!(records(&f).len(), 1);
    f.runtime.del(&conf, &sb, None).unwrap();
    assert!(f.leases().is_empty(), "{:?}", f.leases());

    // GC likewise keeps a stale attachment's lease and record until the agent can be told.
    let sb = f.sandbox(&pod, "gc");
    {
        let _agent = FakeAgent::acking(&f.socket());
        f.runtime.add(&conf, &sb).unwrap();
    }
    assert!(f.runtime.gc(&blocked, &[]).is_err());
    assert_eq!(f.leases().len(), 1);
    assert_eq!(records(&f).len(), 1);
    f.runtime.gc(&conf, &[]).unwrap();
    assert!(f.leases().is_empty(), "{:?}", f.leases());
    assert!(records(&f).is_empty());
    assert!(spooled(&f).iter().any(|d| d.container_id == "cid-gc"));
}

#[test]
fn cni_netns_naming_the_plugins_own_namespace_is_refused() {
    if !require_root("cni_netns_naming_the_plugins_own_namespace_is_refused") {
        return;
    }
    let f = Fixture::new("own", "198.18.62.0/24");
    let agent = FakeAgent::acking(&f.socket());
    let conf = f.conf("1.0.0");
    let pod = NetnsGuard::new("p");
    // The runtime runs the plugin in the node namespace; three paths name it.
    let alias = f.dir.join("node-ns-alias");
    std::os::unix::fs::symlink(format!("/run/netns/{}", f.node.name), &alias).unwrap();
    for path in [format!("/run/netns/{}", f.node.name), alias.display().to_string(), "/proc/self/ns/net".to_string()] {
        let mut sb = f.sandbox(&pod, "own");
        sb.netns = path.clone();
        let e = f.runtime.add(&conf, &sb).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV, "{path}: {e}");
        assert_eq!(e.details, "CNI_NETNS", "{path}: {e:?}");
        assert!(e.msg.contains("own network namespace"), "{path}: {e}");
        assert!(!f.host_link_exists("eth0"), "{path}: the node got a pod interface");
        assert!(!f.host_link_exists(&host_interface_name("cid-own", "eth0")));
        assert!(f.leases().is_empty(), "{path}: {:?}", f.leases());
        // CHECK refuses it the same way.
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [], "ips": []});
        let e = f.runtime.check(&conf, &sb, &prev).unwrap_err();
        assert_eq!((e.code, e.details.as_str()), (code::INVALID_ENV, "CNI_NETNS"), "{path}: {e:?}");
    }
    assert!(agent.seen().is_empty(), "{:?}", agent.seen());
    // The pod's own namespace still works.
    let sb = f.sandbox(&pod, "own");
    let r = f.runtime.add(&conf, &sb).unwrap();
    f.runtime.del(&conf, &sb, Some(&r)).unwrap();
}

/// Runs the binary directly with the given environment and stdin.
fn raw(vars: &[(&str, &str)], stdin: &str) -> (i32, Value, String) {
    use std::io::Write;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flock-cni"));
    cmd.env_clear().stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let v = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"))
    };
    (out.status.code().unwrap_or(-1), v, String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn errors_are_json_on_stdout_with_the_right_code() {
    // No root needed: these fail before touching anything.
    let conf = r#"{"cniVersion":"1.0.0","name":"n","type":"flock-cni","ipam":{"type":"host-local"}}"#;
    let (rc, v, _) = raw(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")], conf);
    assert_eq!((rc, v["code"].as_u64()), (1, Some(4)));
    assert!(v["details"].as_str().unwrap().contains("CNI_NETNS"));
    assert_eq!(v["cniVersion"], "1.0.0");
    let (rc, v, _) = raw(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")], "not json");
    assert_eq!((rc, v["code"].as_u64()), (1, Some(6)));
    let (_, v, _) =
        raw(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")], r#"{"cniVersion":"0.2.0","name":"n"}"#);
    assert_eq!(v["code"], 1);
    let (_, v, _) = raw(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "bad/name"), ("CNI_NETNS", "/x")], conf);
    assert_eq!(v["code"], 4);
    assert!(v["msg"].as_str().unwrap().contains("CNI_IFNAME"));
    let (_, v, _) = raw(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/nonexistent/netns"),
            ("CNI_PATH", DEBIAN_CNI),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=x;K8S_POD_NAME=a"),
        ],
        conf,
    );
    assert_eq!(v["code"], 4);
    assert!(v["details"].as_str().unwrap().contains("CNI_NETNS"), "{v}");
    let (_, v, _) = raw(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/proc/self/ns/net"),
            ("CNI_ARGS", "Foo=1"),
        ],
        conf,
    );
    assert_eq!(v["code"], 2);
    let (_, v, _) = raw(&[("CNI_COMMAND", "GC")], r#"{"cniVersion":"1.1.0","name":"n"}"#);
    assert_eq!(v["code"], 4);
    // VERSION, with and without stdin.
    let (rc, v, _) = raw(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert_eq!(rc, 0);
    assert_eq!(v, json!({"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}));
    let (_, v, _) = raw(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(v["cniVersion"], "1.1.0");
    // Nothing but JSON on stdout, logs on stderr.
    let (_, _, stderr) = raw(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")], "{");
    assert!(stderr.contains("CNI error"), "{stderr}");
}

/// A 50 MB stdin (a valid configuration padded with blanks) is refused with an I/O error
/// object on stdout, after reading at most `MAX_STDIN` of it: the rest cannot be written.
#[test]
fn an_oversized_stdin_is_refused_unread() {
    use std::io::Write;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flock-cni"));
    cmd.env_clear().env("CNI_COMMAND", "VERSION");
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let mut stdin = br#"{"cniVersion":"1.0.0","name":"n","type":"flock-cni"}"#.to_vec();
        stdin.resize(50 << 20, b' ');
        input.write_all(&stdin)
    });
    let out = child.wait_with_output().unwrap();
    let written = writer.join().unwrap();
    assert_eq!(written.map_err(|e| e.kind()), Err(std::io::ErrorKind::BrokenPipe), "the plugin stopped reading");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v["code"], code::IO);
    assert!(v["msg"].as_str().unwrap().contains(&format!("larger than {} bytes", flock_cni::plugin::MAX_STDIN)), "{v}");
}

/// flock removed from the node: the agent marked the config. ADD fails at once; DELs still
/// detach pods; the DEL of the last one removes the config, the plugin (the copy the runtime
/// ran), the spool, the records and the agent's state files — and only flock's.
#[test]
fn after_removal_the_last_pods_del_removes_config_plugin_and_state() {
    if !require_root("after_removal_the_last_pods_del_removes_config_plugin_and_state") {
        return;
    }
    let mut f = Fixture::new("rm", "198.18.57.0/24");
    // The plugin as a node has it: a copy in a directory of its own, which the runtime runs.
    let bin_dir = f.dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::copy(plugin_dir().join("flock-cni"), bin_dir.join("flock-cni")).unwrap();
    f.runtime.cni_path = vec![bin_dir.clone(), PathBuf::from(DEBIAN_CNI)];
    let conf = f.conf("1.0.0");
    let (pa, pb, pc) = (NetnsGuard::new("ra"), NetnsGuard::new("rb"), NetnsGuard::new("rc"));
    let (sa, sb, sc) = (f.sandbox(&pa, "a"), f.sandbox(&pb, "b"), f.sandbox(&pc, "c"));
    let (ra, rb) = {
        let _agent = FakeAgent::acking(&f.socket());
        (f.runtime.add(&conf, &sa).unwrap(), f.runtime.add(&conf, &sb).unwrap())
    };
    // What the agent leaves when it is removed with pods on the node.
    let net_d = f.dir.join("net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    let conflist = net_d.join("10-flock.conflist");
    let agent_state = f.dir.join("agent-state");
    std::fs::create_dir_all(&agent_state).unwrap();
    std::fs::write(agent_state.join("endpoints.json"), "[]").unwrap();
    std::fs::write(agent_state.join("not-flocks"), "kept").unwrap();
    let mark = flock_cni::removal::Removed {
        conflist: conflist.clone(),
        binary: Some(bin_dir.join("flock-cni")),
        agent_state_dir: Some(agent_state.clone()),
    };
    let mut plain = serde_json::to_value(f.conf_with("1.0.0", json!([[{"subnet": f.subnet4}]]), true).plugins).unwrap();
    plain[1][flock_cni::removal::KEY] = serde_json::to_value(&mark).unwrap();
    let text = json!({"cniVersion": "1.0.0", "name": "flock-test", "plugins": plain}).to_string();
    std::fs::write(&conflist, &text).unwrap();
    std::fs::write(net_d.join("99-other.conflist"), "{}").unwrap();
    let marked = ConfList::load(&conflist).unwrap();

    // ADD fails at once (no 5 s wait for an agent), leaving nothing.
    let started = std::time::Instant::now();
    let e = f.runtime.add(&marked, &sc).unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(e.msg.contains("removed"), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(!f.host_link_exists(&host_interface_name("cid-c", "eth0")));
    assert_eq!(f.leases().len(), 2);

    // The first DEL detaches its pod; everything else stays for the other.
    f.runtime.del(&marked, &sa, Some(&ra)).unwrap();
    assert!(!f.host_link_exists(&host_interface_name("cid-a", "eth0")));
    assert!(conflist.exists() && bin_dir.join("flock-cni").exists() && agent_state.join("endpoints.json").exists());
    // The last one removes flock's leftovers, and nothing that is not flock's.
    f.runtime.del(&marked, &sb, Some(&rb)).unwrap();
    assert!(!f.host_link_exists(&host_interface_name("cid-b", "eth0")));
    assert!(f.leases().is_empty(), "{:?}", f.leases());
    assert!(!conflist.exists(), "the config is left");
    assert!(!bin_dir.join("flock-cni").exists(), "the plugin is left");
    assert!(!f.dir.join("pending-del").exists(), "the spool is left");
    assert!(!f.dir.join("state/flock-test").exists(), "the records are left");
    assert!(!agent_state.join("endpoints.json").exists());
    assert!(agent_state.join("not-flocks").exists() && net_d.join("99-other.conflist").exists());
}

/// A mark that names files that are not flock's (another network's config, a binary that is
/// not the running plugin) removes none of them.
#[test]
fn a_mark_naming_foreign_files_removes_none() {
    if !require_root("a_mark_naming_foreign_files_removes_none") {
        return;
    }
    let f = Fixture::new("rmf", "198.18.58.0/24");
    let conf = f.conf("1.0.0");
    let pa = NetnsGuard::new("fa");
    let sa = f.sandbox(&pa, "a");
    let ra = {
        let _agent = FakeAgent::acking(&f.socket());
        f.runtime.add(&conf, &sa).unwrap()
    };
    let other = f.dir.join("99-other.conflist");
    let other_text = json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "ptp"}]}).to_string();
    std::fs::write(&other, &other_text).unwrap();
    let fake_bin = f.dir.join("flock-cni");
    std::fs::write(&fake_bin, "not the plugin").unwrap();
    let mark = flock_cni::removal::Removed { conflist: other.clone(), binary: Some(fake_bin.clone()), agent_state_dir: None };
    let mut plugins = serde_json::to_value(&conf.plugins).unwrap();
    plugins[0][flock_cni::removal::KEY] = serde_json::to_value(&mark).unwrap();
    let marked = ConfList::parse(&json!({"cniVersion": "1.0.0", "name": "flock-test", "plugins": plugins}).to_string()).unwrap();
    f.runtime.del(&marked, &sa, Some(&ra)).unwrap();
    assert_eq!(std::fs::read_to_string(&other).unwrap(), other_text);
    assert!(fake_bin.exists());
    assert!(!f.dir.join("state/flock-test").exists());
}
