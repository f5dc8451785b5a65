//! `flockctl explain` against what is enforced: on every checked cell of every conformance
//! case (IPv4 and IPv6, both ruleset shapes), the offline explanation (from the translator)
//! gives the packet tracer's verdict over the rendered rulesets, and the live explanation
//! (from each node's table as nft lists it) gives the same verdict and names the same rules.
//! Random clusters are compared in `reference.rs` (`fuzzing::differential` checks explain).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use flock::conformance::{self, Expect};
use flock::explain::live::LiveTable;
use flock::explain::{self, End, Explainer, Query, Verdict};
use flock::model::Family;
use flock::model::Snapshot;
use flock::render::RenderOptions;
use flock::testkit::{TracedCluster, pod_ref};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// Every checked cell of `cases` on `base`: (cells, cells whose live rules were checked to
/// name the deciding policy, disagreements).
fn cells(base: &Snapshot, cases: &[PathBuf]) -> (usize, usize, Vec<String>) {
    let (mut n, mut bad, mut named) = (0, Vec::new(), 0usize);
    for dir in cases {
        let case = flock::source::files::load_case(dir).unwrap();
        let mut s = base.clone();
        for (i, step) in case.steps.iter().enumerate() {
            conformance::apply_step(&mut s, step);
            let mut explainer = Explainer::new(&s, flock::translate::Options::default());
            let shapes = [RenderOptions::default(), RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT }];
            let clusters: Vec<TracedCluster> = shapes.iter().map(|o| TracedCluster::build_with(&s, o)).collect();
            // Each node's table, knowing the node's own addresses as the agent's node does.
            let live: Vec<(String, LiveTable)> = clusters[0]
                .texts
                .iter()
                .map(|(node, text)| {
                    let own = clusters[0].node_addrs.get(node).cloned().unwrap_or_default();
                    (node.clone(), LiveTable::parse(&listing(text)).unwrap().with_node_addresses(own))
                })
                .collect();
            for probe in &step.probes {
                for from in &probe.order {
                    for to in &probe.order {
                        if from == to || probe.expect(from, to) == Expect::Unchecked || !case.judged_offline(&s, to) {
                            continue;
                        }
                        let family = probe.family.unwrap_or_else(|| Family::of(s.pod_by_name(&pod_ref(to)).unwrap().ips[0]));
                        let query = Query {
                            from: End::Pod(pod_ref(from)),
                            to: End::Pod(pod_ref(to)),
                            protocol: probe.protocol,
                            port: probe.port,
                            family: Some(family),
                        };
                        let e = explainer.explain(&query).unwrap();
                        let allowed = e.verdict == Verdict::Allow;
                        n += 1;
                        let cell = format!("{} step {i} {} {from} -> {to}", case.dir_name, probe.label());
                        for c in &clusters {
                            let traced = c.connected(from, to, probe.protocol, probe.port, Some(family)).unwrap();
                            if traced != allowed {
                                bad.push(format!("{cell}: tracer {traced}, explain:\n{}", explain::to_text(&e)));
                            }
                        }
                        // Live, on the source's node then (if elsewhere) the destination's:
                        // the nodes enforcing an end (a host-network pod is its node, which
                        // enforces nothing for it).
                        let mut live_allowed = true;
                        let mut nodes: Vec<String> = [&e.from.node, &e.to.node].into_iter().flatten().cloned().collect();
                        nodes.dedup();
                        assert!(!nodes.is_empty(), "{} step {i}: no end of {from} -> {to} is enforced", case.dir_name);
                        for node in nodes {
                            let table = &live.iter().find(|(n, _)| *n == node).unwrap().1;
                            // A pod on this node by name, the other end (maybe named by no
                            // element here) and host-network pods by address.
                            let end = |pod: &str, info: &explain::EndInfo| {
                                if info.node.as_deref() == Some(node.as_str()) {
                                    End::Pod(pod_ref(pod))
                                } else {
                                    End::Address(info.address)
                                }
                            };
                            let live_query = Query { from: end(from, &e.from), to: end(to, &e.to), ..query.clone() };
                            let l = table.explain(&live_query).unwrap();
                            live_allowed &= l.verdict == Verdict::Allow;
                            // The live ingress decision names the policy offline explain names.
                            if let (Some(li), Some(first)) = (&l.ingress, e.ingress.deciding.first())
                                && !li.rules.is_empty()
                            {
                                named += 1;
                                if !li
                                    .rules
                                    .iter()
                                    .any(|r| r.rule.contains(&first.name) || r.matched.iter().any(|m| m.contains(&first.name)))
                                {
                                    bad.push(format!("{cell}: live ingress rules {:?} do not name {}", li.rules, first.name));
                                }
                            }
                        }
                        if live_allowed != allowed {
                            bad.push(format!("{cell}: live {live_allowed}, explain:\n{}", explain::to_text(&e)));
                        }
                    }
                }
            }
        }
    }
    (n, named, bad)
}

/// The render as nft lists it back (`nft -s list table inet flock`): the in-memory nft's
/// canonical dump.
fn listing(text: &str) -> String {
    flock::nft::table::canonical(text).unwrap()
}

#[test]
fn explain_agrees_with_the_enforced_rulesets_on_every_conformance_cell() {
    let cases = flock::source::files::find_cases(&[root().join("conformance")]).unwrap();
    let (n, named, bad) = cells(&flock::testkit::base_cluster(), &cases);
    assert!(bad.is_empty(), "{} of {n} cells:\n{}", bad.len(), bad.join("\n"));
    let v6 = root().join("conformance-v6");
    let base = flock::source::files::load_manifests(&[v6.join("base-cluster.yaml")]).unwrap().to_snapshot();
    let v6_cases = flock::source::files::ipv6_cluster_policy_cases(&root().join("conformance"), &v6).unwrap();
    let (n6, named6, bad) = cells(&base, &v6_cases);
    assert!(bad.is_empty(), "IPv6: {} of {n6} cells:\n{}", bad.len(), bad.join("\n"));
    eprintln!(
        "explain: {n} IPv4 and {n6} IPv6 cells agree with the tracer and the live tables ({} live ingress decisions name the policy)",
        named + named6
    );
    assert!(cases.len() > 40 && n > 1000 && named > 500, "{} cases, {n} cells, {named} named", cases.len());
}

/// A domain rule in a live table: an address the proxy learned (nft lists its timeout and
/// what is left of it) is admitted, and the explanation names the rule and the learned name
/// with its expiry; offline, where nothing is learned, and live before learning, it is not.
#[test]
fn live_explain_names_the_domain_rule_and_the_learned_address() {
    let s = flock::testkit::base_cluster_with(&flock::testkit::domain_policy("y", &["*.example.test"], 443));
    let node = s.pod_by_name(&pod_ref("y/a")).and_then(|p| p.node.clone()).unwrap();
    let cluster = TracedCluster::build(&s);
    let text = cluster.texts.iter().find(|(n, _)| **n == node).map(|(_, t)| t.clone()).unwrap();
    let out: std::net::IpAddr = "198.18.250.80".parse().unwrap();
    let query =
        Query { from: End::Pod(pod_ref("y/a")), to: End::Address(out), protocol: flock::model::Protocol::Tcp, port: 443, family: None };
    assert_eq!(LiveTable::parse(&text).unwrap().explain(&query).unwrap().verdict, Verdict::Deny);
    assert_eq!(Explainer::new(&s, flock::translate::Options::default()).explain(&query).unwrap().verdict, Verdict::Deny);

    // As nft lists a timed set holding a learned address.
    let set =
        text.lines().find_map(|l| l.trim().strip_prefix("set domains-v4-")).map(|rest| rest.trim_end_matches(" {").to_string()).unwrap();
    let marker = format!("set domains-v4-{set} {{\n\t\ttype ipv4_addr\n\t\tflags timeout\n");
    assert!(text.contains(&marker), "{text}");
    let learned = text.replace(
        &marker,
        &format!(
            "{marker}\t\telements = {{ 198.18.250.80 timeout 30s expires 12s500ms comment \"api.example.test (via api.example.test)\" }}\n"
        ),
    );
    let e = LiveTable::parse(&learned).unwrap().explain(&query).unwrap();
    assert_eq!(e.verdict, Verdict::Allow, "{}", explain::live::to_text(&e));
    let rule = e.path.iter().find(|r| r.rule.contains("@domains-v4-")).expect("the domain rule");
    assert!(rule.rule.contains("by-name egress[0] example: Accept"), "{}", rule.rule);
    assert_eq!(rule.matched, ["api.example.test (via api.example.test) (learned 17s500ms ago: timeout 30s, expires in 12s500ms)"]);
    // `nft -s` lists no expiry: what is left comes from a netlink read of the set.
    let stateless =
        text.replace(&marker, &format!("{marker}\t\telements = {{ 198.18.250.80 timeout 30s comment \"api.example.test\" }}\n"));
    let mut table = LiveTable::parse(&stateless).unwrap();
    let timed = table.timed_sets();
    assert!(timed.len() == 2 && timed.contains(&format!("domains-v4-{set}")), "{timed:?}");
    table.learned(&format!("domains-v4-{set}"), &[(out, std::time::Duration::from_secs(30), std::time::Duration::from_millis(7_250))]);
    let e = table.explain(&query).unwrap();
    let rule = e.path.iter().find(|r| r.rule.contains("@domains-v4-")).expect("the domain rule");
    assert_eq!(rule.matched, ["api.example.test (learned 22s750ms ago: timeout 30s, expires in 7s250ms)"]);
    // Port 22 is not the rule's.
    let e = LiveTable::parse(&learned).unwrap().explain(&Query { port: 22, ..query }).unwrap();
    assert_eq!(e.verdict, Verdict::Deny);
}
