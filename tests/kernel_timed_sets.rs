//! Learned addresses in timed sets, against the real kernel in a throwaway network namespace
//! (root only): written over netlink with their TTLs, read back with what is left of them,
//! refreshed when learned again, and gone when their time is up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use flock::apply::netlink::NfSocket;
use flock::apply::netlink::timed::TimedElement;
use flock::dns::{DomainPattern, Learned};
use flock::dns_proxy::learner::{DomainLearner, DomainRule, KernelWriter};
use flock::dns_proxy::proxy::Learner;
use flock::netns;
use flock::render::names::TABLE;
use flock::testkit::kernel::{NetnsGuard, require_root};

fn element(addr: &str, millis: u64, comment: &str) -> TimedElement {
    TimedElement { addr: addr.parse().unwrap(), timeout: Duration::from_millis(millis), comment: comment.into() }
}

/// Loads an nft script into `ns`.
fn load(ns: &NetnsGuard, tag: &str, script: &str) {
    let path = std::env::temp_dir().join(format!("flkt-{tag}-{}.nft", std::process::id()));
    std::fs::write(&path, script).unwrap();
    ns.exec(&["nft", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn learned_addresses_live_in_timed_sets_until_their_ttl_passes() {
    if !require_root("learned_addresses_live_in_timed_sets_until_their_ttl_passes") {
        return;
    }
    let ns = NetnsGuard::new("timed");
    let script = format!(
        "table inet {TABLE} {{\n  set dom-t-v4 {{ type ipv4_addr; flags timeout; comment \"test\"; }}\n  \
         set dom-t-v6 {{ type ipv6_addr; flags timeout; comment \"test\"; }}\n}}\n"
    );
    load(&ns, "timed", &script);

    let (first, refreshed, after) = netns::run_in(&ns.netns(), || {
        let mut s = NfSocket::open().unwrap();
        s.write_timed(
            &[
                ("dom-t-v4", vec![element("198.18.1.10", 1500, "api.example.test"), element("198.18.1.11", 60_000, "api.example.test")]),
                ("dom-t-v6", vec![element("2001:db8:1::10", 60_000, "api.example.test")]),
            ],
            &[],
        )
        .unwrap();
        let first = (s.dump_timed("dom-t-v4").unwrap(), s.dump_timed("dom-t-v6").unwrap());
        // Learned again with a longer TTL: the timeout is refreshed (kernels since 6.10).
        s.write_timed(&[("dom-t-v4", vec![element("198.18.1.11", 120_000, "api.example.test")])], &[]).unwrap();
        let refreshed = s.dump_timed("dom-t-v4").unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        (first, refreshed, s.dump_timed("dom-t-v4").unwrap())
    })
    .unwrap();

    let (v4, v6) = first;
    let addrs: Vec<IpAddr> = v4.iter().map(|e| e.addr).collect();
    assert_eq!(addrs, vec!["198.18.1.10".parse::<IpAddr>().unwrap(), "198.18.1.11".parse().unwrap()]);
    assert_eq!(v4[0].timeout, Duration::from_millis(1500));
    assert!(v4[0].expires_in <= Duration::from_millis(1500) && v4[0].expires_in > Duration::ZERO);
    assert_eq!(v4[1].comment, "api.example.test");
    assert_eq!(v6.len(), 1);
    assert_eq!(v6[0].addr, "2001:db8:1::10".parse::<IpAddr>().unwrap());
    let r = refreshed.iter().find(|e| e.addr == "198.18.1.11".parse::<IpAddr>().unwrap()).unwrap();
    assert!(r.expires_in > Duration::from_secs(60), "not refreshed: {r:?}");
    // nf_tables expired the short one by itself.
    let left: Vec<IpAddr> = after.iter().map(|e| e.addr).collect();
    assert_eq!(left, vec!["198.18.1.11".parse::<IpAddr>().unwrap()]);

    // nft lists what netlink wrote, comments and all.
    let listed = String::from_utf8(ns.exec(&["nft", "list", "set", "inet", TABLE, "dom-t-v4"]).stdout).unwrap();
    assert!(listed.contains("198.18.1.11 timeout 2m expires") && listed.contains("comment \"api.example.test\""), "{listed}");

    // A set that does not exist: the refusal names it.
    let err = netns::run_in(&ns.netns(), || {
        NfSocket::open().unwrap().write_timed(&[("dom-missing", vec![element("198.18.1.12", 1000, "")])], &[]).unwrap_err()
    })
    .unwrap();
    assert!(err.to_string().contains("dom-missing"), "{err}");
}

#[test]
fn the_learner_writes_a_pods_answer_into_its_rules_sets() {
    if !require_root("the_learner_writes_a_pods_answer_into_its_rules_sets") {
        return;
    }
    let ns = NetnsGuard::new("learn");
    let script = format!(
        "table inet {TABLE} {{\n  set dom-r-v4 {{ type ipv4_addr; flags timeout; }}\n  set dom-r-v6 {{ type ipv6_addr; flags timeout; }}\n}}\n"
    );
    load(&ns, "learn", &script);
    let client: IpAddr = "198.18.0.7".parse().unwrap();
    let entries = netns::run_in(&ns.netns(), move || {
        let learner = DomainLearner::new(KernelWriter::default());
        learner.set_rules(vec![DomainRule {
            source: "policy x/allow-pypi egress[0]".into(),
            pods: BTreeSet::from([client]),
            patterns: vec![DomainPattern::parse("*.pypi.org").unwrap()],
            set_v4: "dom-r-v4".into(),
            set_v6: "dom-r-v6".into(),
        }]);
        let learned = Learned {
            name: "files.pypi.org".into(),
            chain: vec![],
            addresses: vec![("198.18.5.1".parse().unwrap(), 300), ("2001:db8:5::1".parse().unwrap(), 300)],
            dropped: 0,
        };
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let resolver: SocketAddr = "198.18.0.53:53".parse().unwrap();
        rt.block_on(learner.learn(client, resolver, &learned)).unwrap();
        let mut s = NfSocket::open().unwrap();
        (s.dump_timed("dom-r-v4").unwrap(), s.dump_timed("dom-r-v6").unwrap())
    })
    .unwrap();
    assert_eq!(entries.0.iter().map(|e| e.addr).collect::<Vec<_>>(), vec!["198.18.5.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(entries.1.iter().map(|e| e.addr).collect::<Vec<_>>(), vec!["2001:db8:5::1".parse::<IpAddr>().unwrap()]);
    assert_eq!(entries.0[0].timeout, Duration::from_secs(300));
    assert_eq!(entries.0[0].comment, "files.pypi.org");
}

/// What the proxy learned survives flock's own transactions on the real kernel: an
/// incremental sync, a full sync by a fresh applier (as after an agent restart, through the
/// netlink writer and through nft), and the drift check, which does not count learned
/// elements as drift. A timed set the render no longer has goes.
#[test]
fn learned_addresses_survive_syncs_restarts_and_drift_checks() {
    if !require_root("learned_addresses_survive_syncs_restarts_and_drift_checks") {
        return;
    }
    use flock::apply::kernel::NftCli;
    use flock::apply::{Applier, Drift};
    use flock::render::{self, DnsSteer, RenderOptions};
    use flock::translate::{Options, translate};

    let s = flock::testkit::base_cluster_with(&flock::testkit::domain_policy("y", &["*.example.test"], 443));
    let node = s.pod_by_name(&flock::testkit::pod_ref("y/a")).and_then(|p| p.node.clone()).unwrap();
    let options = RenderOptions {
        dns: Some(DnsSteer::new(15053, render::DNS_MARK, vec!["198.18.250.53/32".parse().unwrap()])),
        ..RenderOptions::DEFAULT
    };
    let rs = |s: &flock::model::Snapshot| render::render_with(&translate(s, &s.derived_endpoints(&node), &Options::default()), &options);
    let first = rs(&s);
    let np = translate(&s, &s.derived_endpoints(&node), &Options::default());
    let def = render::domain_uses(&np).keys().next().copied().cloned().unwrap();
    let set = render::domain_set_name(&def, false);

    let ns = NetnsGuard::new("timedsync");
    for netlink in [true, false] {
        let _ = ns.try_exec(&["nft", "delete", "table", "inet", TABLE]);
        let mut a = Applier::new(NftCli::new(ns.netns()).with_netlink(netlink));
        a.apply(&first).unwrap();
        let learned = |ns: &NetnsGuard| {
            let set = set.clone();
            netns::run_in(&ns.netns(), move || NfSocket::open().unwrap().dump_timed(&set).unwrap()).unwrap()
        };
        let set2 = set.clone();
        netns::run_in(&ns.netns(), move || {
            NfSocket::open()
                .unwrap()
                .write_timed(&[(set2.as_str(), vec![element("198.18.250.80", 60_000, "api.example.test")])], &[])
                .unwrap()
        })
        .unwrap();
        assert_eq!(learned(&ns).len(), 1);
        // The drift check: learned elements are not drift.
        a.record_baseline().unwrap();
        let set3 = set.clone();
        netns::run_in(&ns.netns(), move || {
            NfSocket::open()
                .unwrap()
                .write_timed(&[(set3.as_str(), vec![element("198.18.250.81", 60_000, "www.example.test")])], &[])
                .unwrap()
        })
        .unwrap();
        assert_eq!(a.check_drift().unwrap(), Drift::InSync, "netlink {netlink}");
        // An incremental sync (another policy change), then a full sync by a fresh applier.
        let mut s2 = s.clone();
        for o in flock::testkit::parse_manifests(
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
",
        )
        .objects
        {
            o.apply_to(&mut s2);
        }
        a.apply(&rs(&s2)).unwrap();
        assert_eq!(learned(&ns).len(), 2, "an incremental sync kept them (netlink {netlink})");
        let mut restarted = Applier::new(NftCli::new(ns.netns()).with_netlink(netlink));
        restarted.apply(&first).unwrap();
        assert_eq!(learned(&ns).len(), 2, "a full sync kept them (netlink {netlink})");
        // Names no rule has any more: their sets go.
        let s3 = flock::testkit::base_cluster_with(&flock::testkit::domain_policy("y", &["other.test"], 443));
        restarted.apply(&rs(&s3)).unwrap();
        let listing = String::from_utf8(ns.exec(&["nft", "list", "table", "inet", TABLE]).stdout).unwrap();
        assert!(!listing.contains(&set), "{listing}");
    }
}
