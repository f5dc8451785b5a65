//! flock-cni ADD returns only after the agent acknowledges, and no packet reaches or leaves
//! a new pod before its rules are committed: the node's forward hook drops unknown pod
//! interfaces (flock's ruleset, applied with real nft), and an agent that takes its time
//! commits the pod's rules before acknowledging.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::apply::Applier;
use flock::apply::kernel::NftCli;
use flock::model::{LocalEndpoint, ObjectRef, Pod, PodPhase, Snapshot};
use flock::testkit::kernel::{FakeAgent, NetnsGuard, TempDir, flock_cni_binary, require_root};
use flock::translate::{Options, translate};
use flock_cni::protocol::{Reply, Request};
use flock_cni::runtime::{ConfList, Runtime, Sandbox};
use serde_json::json;

fn pod(name: &str, ip: IpAddr) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: [("app".to_string(), name.to_string())].into(),
        node: Some("n1".into()),
        phase: PodPhase::Running,
        ips: vec![ip],
        host_network: false,
        ports: vec![],
        created: None,
        unpublished: false,
    }
}

/// The agent's work for one ADD: register the endpoint, render the node, commit.
fn program(
    applier: &Mutex<Applier<NftCli>>,
    snapshot: &Snapshot,
    endpoints: &Mutex<Vec<LocalEndpoint>>,
    req: &flock_cni::protocol::AddRequest,
) {
    let mut eps = endpoints.lock().unwrap();
    eps.push(LocalEndpoint {
        interface: req.host_interface.clone(),
        container_id: req.container_id.clone(),
        pod: ObjectRef::new(req.pod.namespace.clone(), req.pod.name.clone()),
        pod_uid: req.pod.uid.clone(),
        addrs: req.ips.clone(),
    });
    let rs = flock::render::render(&translate(snapshot, &eps, &Options::default()));
    applier.lock().unwrap().apply(&rs).unwrap();
}

#[test]
fn add_waits_for_the_agent_and_nothing_passes_before_the_rules() {
    if !require_root("add_waits_for_the_agent_and_nothing_passes_before_the_rules") {
        return;
    }
    let node = NetnsGuard::new("node");
    node.ip(&["link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer"]);
    node.ip(&["link", "set", "uplink", "up"]);
    node.ip(&["link", "set", "uplink-peer", "up"]);
    node.ip(&["route", "add", "default", "dev", "uplink"]);
    let dir = TempDir::new("order");
    let (ip_a, ip_b): (IpAddr, IpAddr) = ("198.18.60.10".parse().unwrap(), "198.18.60.20".parse().unwrap());
    let mut snapshot = Snapshot::new();
    snapshot.upsert_namespace(flock::model::convert::implicit_namespace("default"));
    snapshot.upsert_pod(pod("a", ip_a));
    snapshot.upsert_pod(pod("b", ip_b));

    // The node's ruleset before any pod: unknown pod interfaces are dropped.
    let applier = Arc::new(Mutex::new(Applier::new(NftCli::new(node.netns()))));
    applier.lock().unwrap().apply(&flock::render::render(&translate(&snapshot, &[], &Options::default()))).unwrap();

    let endpoints = Arc::new(Mutex::new(Vec::new()));
    let committed: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::new(Mutex::new(None));
    let delay = Duration::from_millis(1500);
    let (ap, sn, ep, cm) = (applier.clone(), snapshot.clone(), endpoints.clone(), committed.clone());
    let _agent = FakeAgent::start(
        &dir.join("cni.sock"),
        Arc::new(move |req: &Request| {
            if let Request::Add(add) = req {
                if add.pod.name == "b" {
                    std::thread::sleep(delay);
                    // Taken before the transaction starts: a probe that *finished* before
                    // this instant and succeeded passed without rules. (A probe that started
                    // before but ran during the commit proves nothing either way.)
                    let begin = Instant::now();
                    program(&ap, &sn, &ep, add);
                    *cm.lock().unwrap() = Some((begin, Instant::now()));
                } else {
                    program(&ap, &sn, &ep, add);
                }
            }
            Reply::ok()
        }),
    );

    let runtime =
        Runtime { cni_path: vec![flock_cni_binary().parent().unwrap().to_path_buf(), PathBuf::from("/usr/lib/cni")], netns: node.netns() };
    let conf = ConfList::parse(
        &json!({"cniVersion": "1.0.0", "name": "order", "plugins": [{
            "type": "flock-cni", "agentSocket": dir.join("cni.sock"), "stateDir": dir.join("state"),
            "pendingDelDir": dir.join("spool"), "agentTimeoutSeconds": 10,
            "ipam": {"type": "host-local", "dataDir": dir.join("ipam"), "ranges": [[{"subnet": "198.18.60.0/24"}]]}
        }]})
        .to_string(),
    )
    .unwrap();
    let (pa, pb) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"));
    let sandbox = |p: &NetnsGuard, name: &str, ip: IpAddr| {
        let mut s =
            Sandbox::for_pod(&format!("cid-{name}"), &format!("/run/netns/{}", p.name), "default", name, Some(&format!("uid-{name}")));
        s.args.push(("IP".into(), ip.to_string()));
        s
    };
    runtime.add(&conf, &sandbox(&pa, "a", ip_a)).unwrap();

    // Probe both directions every few milliseconds while b is being added.
    let stop = Arc::new(AtomicBool::new(false));
    let probe = |from: String, to: IpAddr| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // (started, finished, passed)
            let mut log: Vec<(Instant, Instant, bool)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = std::process::Command::new("ip")
                    .args(["netns", "exec", &from, "ping", "-c", "1", "-W", "0.1", &to.to_string()])
                    .output()
                    .is_ok_and(|o| o.status.success());
                log.push((t, Instant::now(), ok));
                std::thread::sleep(Duration::from_millis(20));
            }
            log
        })
    };
    let a_to_b = probe(pa.name.clone(), ip_b);
    let b_to_a = probe(pb.name.clone(), ip_a);
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let result = runtime.add(&conf, &sandbox(&pb, "b", ip_b)).unwrap();
    let returned = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (ab, ba) = (a_to_b.join().unwrap(), b_to_a.join().unwrap());

    let (commit_began, committed) = committed.lock().unwrap().expect("the agent never committed b");
    assert!(returned >= committed, "ADD returned before the agent committed the rules");
    assert!(returned - started >= delay, "ADD returned early: {:?}", returned - started);
    assert_eq!(result["ips"][0]["address"], format!("{ip_b}/32"));
    for (dir_name, log) in [("a → b", &ab), ("b → a", &ba)] {
        let early: Vec<_> = log.iter().filter(|(_, end, ok)| *ok && *end < commit_began).collect();
        assert!(early.is_empty(), "{dir_name}: {} probes passed before the rules were committed", early.len());
        let during_wait = log.iter().filter(|(_, end, _)| *end < commit_began).count();
        assert!(during_wait >= 5, "{dir_name}: too few probes during the wait ({during_wait})");
        assert!(log.iter().any(|(t, _, ok)| *ok && *t > committed), "{dir_name}: never passed after the commit");
    }
}
