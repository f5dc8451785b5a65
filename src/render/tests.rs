//! Renderer tests: goldens (readable nft), determinism, structure properties, and the
//! conformance cases run through the packet tracer over the fake-applied rulesets.

use std::path::{Path, PathBuf};

use super::*;
use crate::apply::{Applier, fake::FakeNft};
use crate::model::{LocalEndpoint, Snapshot};
use crate::testkit::{self, TracedCluster};
use crate::translate::{Options, translate};

fn render_node(s: &Snapshot, node: &str) -> Ruleset {
    render(&translate(s, &s.derived_endpoints(node), &Options::default()))
}

/// Every endpoint's allow rules through peer classes, however few.
const CLASSES: RenderOptions = RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT };

fn render_classes(s: &Snapshot, node: &str) -> Ruleset {
    render_with(&translate(s, &s.derived_endpoints(node), &Options::default()), &CLASSES)
}

fn with(policies: &str) -> Snapshot {
    let mut s = testkit::base_cluster();
    for p in testkit::policies(policies) {
        s.upsert_policy(p);
    }
    s
}

/// Compares with `tests/golden/<name>.nft`; `FLOCK_BLESS=1` rewrites the file.
fn golden(name: &str, text: &str) {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.nft"));
    if std::env::var_os("FLOCK_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (run with FLOCK_BLESS=1 to create it)", path.display()));
    if want != text {
        let line = want.lines().zip(text.lines()).position(|(a, b)| a != b).map_or(want.lines().count().min(text.lines().count()), |i| i);
        panic!(
            "{} differs from the render at line {}:\n  golden: {:?}\n  render: {:?}\n(run with FLOCK_BLESS=1 to accept)",
            path.display(),
            line + 1,
            want.lines().nth(line),
            text.lines().nth(line)
        );
    }
}

const DENY_AND_ALLOW: &str = "
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
    ports: [{port: 80}, {port: 81, protocol: UDP}]
";

const EGRESS_MIX: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-mix, namespace: z}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: c}}, namespaceSelector: {}}]
    ports: [{port: serve-80-tcp}, {port: 8000, endPort: 8100}]
  - to: [{ipBlock: {cidr: 198.18.0.0/15, except: [198.18.2.0/24]}}]
    ports: [{protocol: UDP, port: 53}]
  - ports: [{protocol: SCTP}]
";

#[test]
fn golden_no_policy() {
    golden("no-policy-node-1", &render_node(&testkit::base_cluster(), "node-1").to_text());
}

/// Under an overlay: the `overlay-in` chain and its sets, for dual-stack nodes (node-2 with
/// two InternalIPs of a family: each sends for its pods), a node without InternalIPs (it
/// sends nothing), and what the guard does not trust: an InternalIP two nodes claim, one
/// inside a pod CIDR, and pod CIDRs that overlap — the whole table, as nft lists it.
#[test]
fn golden_overlay_dual_stack() {
    let mut s = testkit::base_cluster();
    for (name, ips, cidrs) in [
        ("node-1", vec!["198.18.0.1", "2001:db8::1"], vec!["198.18.1.0/24", "198.18.1.128/25", "2001:db8:1::/64"]),
        ("node-2", vec!["198.18.0.2", "198.18.9.2", "198.18.2.77", "2001:db8::2"], vec!["198.18.2.0/24", "2001:db8:2::/64"]),
    ] {
        let mut n = s.node(name).unwrap().clone();
        n.internal_ips = ips.into_iter().map(|a| a.parse().unwrap()).collect();
        n.pod_cidrs = cidrs.into_iter().map(|c| c.parse().unwrap()).collect();
        s.upsert_node(n);
    }
    let mut other = s.node("node-1").unwrap().clone();
    other.name = "node-3".into();
    other.internal_ips = vec!["198.18.9.2".parse().unwrap()];
    other.pod_cidrs = vec!["198.18.3.0/24".parse().unwrap()];
    s.upsert_node(other);
    let options = Options { overlay_port: Some(4789), overlay_node: Some("node-1".into()), ..Options::default() };
    let np = translate(&s, &s.derived_endpoints("node-1"), &options);
    let rs = render(&np);
    let text = rs.to_text();
    golden("overlay-dual-stack-node-1", &text);
    // The last rule of the guard drops whatever no set took: fail closed.
    let Some(Object::Chain(c)) = rs.object(OVERLAY_IN) else { panic!("no {OVERLAY_IN}") };
    let last = c.rules.last().and_then(|r| r.verdict.clone());
    assert!(matches!(&last, Some(Verdict::Drop)) || last == Some(Verdict::Goto(DENY_SPOOFED.into())), "{last:?}");
    // First, the outer destination must be this node's VXLAN device's (node-1's first
    // InternalIP of each family); then the senders' sets.
    assert!(c.rules[..2].iter().all(|r| r.verdict == last), "{:?}", c.rules);
    assert!(c.rules[2..c.rules.len() - 1].iter().all(|r| r.verdict == Some(Verdict::Return)));
    assert!(text.contains("elements = { 198.18.0.1 comment \"this node's VXLAN device\" }"), "{text}");
    assert!(text.contains("ip daddr != @overlay-local-v4 counter goto deny-spoofed"), "{text}");
    // A pod's UDP to the VXLAN port goes to pod CIDRs only.
    assert!(text.contains("ip daddr != @overlay-pod-cidrs-v4 udp dport 4789 counter goto deny-spoofed"), "{text}");
    assert!(text.contains("2001:db8:2::/64 comment \"pod CIDR\""), "{text}");
    assert!(text.contains("198.18.0.2 . 0xc6120200-0xc61202ff comment \"node-2: pods 198.18.2.0/24\""));
    assert!(text.contains("2001:db8::2 . 0xc6120002 comment \"node-2: its address 198.18.0.2\""));
    // Not trusted: 198.18.9.2 (node-2's and node-3's), so node-3 sends nothing; 198.18.2.77 as
    // a source (node-2's pod CIDR holds it), though node-2 sends from it; the /25 is inside
    // the /24 (one interval, or the kernel would refuse the set).
    assert!(!text.contains("198.18.9.2 . ") && !text.contains("0xc6120902") && !text.contains("node-3"), "{text}");
    assert!(text.contains("198.18.2.77 . 0xc6120200-0xc61202ff") && !text.contains("0xc612024d"), "{text}");
    assert!(!text.contains("0xc6120180"), "{text}");
    let problems = &np.overlay.as_ref().unwrap().problems;
    assert_eq!(
        problems,
        &[
            "node node-2: InternalIP 198.18.2.77 lies in a pod CIDR: not taken as a source inside its VXLAN",
            "node node-2: InternalIP 198.18.9.2 is claimed by 2 nodes: no VXLAN is taken from it",
            "node node-3: InternalIP 198.18.9.2 is claimed by 2 nodes: no VXLAN is taken from it",
        ]
    );
    // The guard reads `@th` after the kernel reassembled the packet: IPv6 is reassembled
    // before the input hook only because the table tracks connections (`ct`).
    assert!(text.contains("ct state established,related accept"));
    // Without the overlay, none of it.
    let plain = render(&translate(&s, &s.derived_endpoints("node-1"), &Options::default())).to_text();
    assert!(!plain.contains("overlay"));
}

#[test]
fn golden_deny_and_allow() {
    golden("deny-and-allow-node-1", &render_node(&with(DENY_AND_ALLOW), "node-1").to_text());
    golden("deny-and-allow-classes-node-1", &render_classes(&with(DENY_AND_ALLOW), "node-1").to_text());
}

#[test]
fn golden_egress_mix_dual_stack() {
    let mut s = with(EGRESS_MIX);
    // z/a and z/c dual-stack.
    for name in ["z/a", "z/c"] {
        let mut p = s.pod_by_name(&testkit::pod_ref(name)).unwrap().clone();
        let last = p.ips[0].to_string().rsplit('.').next().unwrap().to_string();
        p.ips.push(format!("2001:db8:1::{last}").parse().unwrap());
        s.upsert_pod(p);
    }
    golden("egress-mix-dual-stack-node-1", &render_node(&s, "node-1").to_text());
    golden("egress-mix-dual-stack-classes-node-1", &render_classes(&s, "node-1").to_text());
}

#[test]
fn rendering_is_deterministic() {
    let s = with(&format!("{DENY_AND_ALLOW}\n---\n{EGRESS_MIX}"));
    let a = render_node(&s, "node-1").to_text();
    let b = render_node(&s.clone(), "node-1").to_text();
    assert_eq!(a, b);
    // Endpoint order does not matter.
    let mut eps = s.derived_endpoints("node-1");
    eps.reverse();
    assert_eq!(render(&translate(&s, &eps, &Options::default())).to_text(), a);
}

#[test]
fn render_text_is_its_own_canonical_listing() {
    // What is written parses back to the same objects (and the fake's dump of it parses to
    // itself): the basis of drift detection.
    let s = with(&format!("{DENY_AND_ALLOW}\n---\n{EGRESS_MIX}"));
    let text = render_node(&s, "node-1").to_text();
    let canon = crate::nft::canonical(&text).unwrap();
    let mut applier = Applier::new(FakeNft::new());
    applier.apply(&render_node(&s, "node-1")).unwrap();
    assert_eq!(applier.backend().table().unwrap().dump(), canon);
}

#[test]
fn rules_per_pod_do_not_grow_with_peer_addresses() {
    let count_rules = |extra: usize| {
        let mut s = with(DENY_AND_ALLOW);
        let template = s.pod_by_name(&testkit::pod_ref("y/a")).unwrap().clone();
        for i in 0..extra {
            let mut p = template.clone();
            p.name = format!("extra-{i}");
            p.uid = format!("uid-extra-{i}");
            p.ips = vec![format!("198.18.{}.{}", 100 + i / 200, i % 200 + 1).parse().unwrap()];
            s.upsert_pod(p);
        }
        let rs = render_node(&s, "node-1");
        let st = rs.stats();
        (st.rules, st.elements)
    };
    let (rules_small, elems_small) = count_rules(0);
    let (rules_big, elems_big) = count_rules(1000);
    assert_eq!(rules_small, rules_big);
    assert_eq!(elems_big, elems_small + 1000);
}

#[test]
fn equal_peers_share_one_set_across_pods_and_policies() {
    let text = render_node(&with(DENY_AND_ALLOW), "node-1").to_text();
    let peer_sets: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("set peers-")).collect();
    assert_eq!(peer_sets.len(), 1, "{text}");
    let rs = render_classes(&with(DENY_AND_ALLOW), "node-1");
    let text = rs.to_text();
    // One peer class (all pods of namespace y), one map element per peer address.
    let classes: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("chain ingress-class-")).collect();
    assert_eq!(classes.len(), 1, "{text}");
    let Some(Object::Set(map)) = rs.object("ingress-peer-addrs-v4") else { panic!("no ingress-peer-addrs-v4 map:\n{text}") };
    assert_eq!(map.elements.len(), 3, "{text}");
}

#[test]
fn hostile_strings_never_become_syntax() {
    // Names and labels no API server would accept, straight from a manifest.
    let mut s = testkit::base_cluster();
    let mut p = s.pod_by_name(&testkit::pod_ref("x/a")).unwrap().clone();
    p.name = "a\" accept; } chain evil { drop".into();
    p.labels.insert("pod", "a\"\n}");
    s.upsert_pod(p.clone());
    let mut np = testkit::policies(DENY_AND_ALLOW);
    for pol in &mut np {
        pol.name = format!("{}\"; flush ruleset; #{}", pol.name, "\u{202e}".repeat(3));
        s.upsert_policy(pol.clone());
    }
    let rs = render_node(&s, "node-1");
    let text = rs.to_text();
    let parsed = crate::nft::NftRuleset::from_text(&text).unwrap();
    let t = parsed.table("inet", "flock").unwrap();
    // Exactly the rendered objects, nothing injected.
    assert_eq!(t.chains.len() + t.sets.len(), rs.objects.len());
    assert!(!t.chains.contains_key("evil"));
    for o in &rs.objects {
        assert!(o.name().bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b)), "{}", o.name());
    }
    // And the endpoint is still programmed under its escaped comment.
    let ep = LocalEndpoint::for_pod(&p);
    assert!(text.contains(&format!("\"{}\"", ep.interface)));
}

#[test]
fn conformance_cases_hold_through_the_tracer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let base = testkit::base_cluster();
    let cases = crate::source::files::find_cases(&[root]).unwrap();
    let mut failures = Vec::new();
    for dir in &cases {
        let case = crate::source::files::load_case(dir).unwrap();
        for shape in [RenderOptions::default(), CLASSES] {
            match TracedCluster::run_case_with(&base, &case, &shape) {
                Ok(m) if m.is_empty() => {}
                Ok(m) => failures.push(format!("{} ({shape:?}): {} cells differ, first: {}", case.dir_name, m.len(), m[0])),
                Err(e) => failures.push(format!("{} ({shape:?}): {e}", case.dir_name)),
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// The generated cases `tests/conformance_random.rs` runs on real kernels, through the tracer
/// first (the pipeline against the reference evaluator, without a kernel), and more of them.
#[test]
fn generated_cases_hold_through_the_tracer() {
    let base = testkit::base_cluster();
    let mut failures = Vec::new();
    let cases = testkit::cases::generate(&base, 2026, 400);
    for g in &cases {
        let case = crate::conformance::parse_case(Path::new("case.yaml"), &g.dir_name, &g.yaml).unwrap();
        match TracedCluster::run_case_with(&base, &case, &RenderOptions::default()) {
            Ok(m) if m.is_empty() => {}
            Ok(m) => failures.push(format!("{}: {} cells differ, first: {}\n{}", case.dir_name, m.len(), m[0], g.yaml)),
            Err(e) => failures.push(format!("{}: {e}", case.dir_name)),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn cluster_policy_cases_hold_on_the_ipv6_base_through_the_tracer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let v6 = root.join("conformance-v6");
    let base = crate::source::files::load_manifests(&[v6.join("base-cluster.yaml")]).unwrap().to_snapshot();
    assert!(base.pods().all(|p| p.ips.iter().all(|ip| ip.is_ipv6())));
    let cases = crate::source::files::ipv6_cluster_policy_cases(&root.join("conformance"), &v6).unwrap();
    assert!(cases.len() >= 25, "{cases:?}");
    let mut failures = Vec::new();
    for dir in &cases {
        let case = crate::source::files::load_case(dir).unwrap();
        for shape in [RenderOptions::default(), CLASSES] {
            match TracedCluster::run_case_with(&base, &case, &shape) {
                Ok(m) if m.is_empty() => {}
                Ok(m) => failures.push(format!("{} ({shape:?}): {} cells differ, first: {}", case.dir_name, m.len(), m[0])),
                Err(e) => failures.push(format!("{} ({shape:?}): {e}", case.dir_name)),
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn traced_matrix_for_deny_and_allow() {
    let c = TracedCluster::build(&with(DENY_AND_ALLOW));
    use crate::model::Protocol::{Tcp, Udp};
    assert!(c.connected("y/b", "x/a", Tcp, 80, None).unwrap());
    assert!(c.connected("y/a", "x/a", Udp, 81, None).unwrap()); // cross-node
    assert!(!c.connected("y/b", "x/a", Tcp, 81, None).unwrap());
    assert!(!c.connected("z/a", "x/a", Tcp, 80, None).unwrap());
    assert!(!c.connected("x/c", "x/b", Tcp, 80, None).unwrap());
    assert!(c.connected("x/a", "z/b", Tcp, 80, None).unwrap());
}

/// A ClusterNetworkPolicy with a domain rule: its timed sets (empty, `flags timeout`) and
/// rules marking what they admit; with the proxy, the steering of the pod's DNS to trusted
/// resolvers through its own egress chains. The golden shows it; the fake applies it; the
/// tracer sees the domain rule match nothing until something is learned.
#[test]
fn domain_rules_render_timed_sets_and_dns_steering() {
    let s = testkit::base_cluster_with(&testkit::domain_policy("y", &["*.example.test", "api.example.test"], 443));
    let np = translate(&s, &s.derived_endpoints("node-1"), &Options::default());
    let uses = domain_uses(&np);
    assert_eq!(uses.len(), 1, "{uses:?}");
    let (def, used) = uses.iter().next().unwrap();
    assert_eq!(def.short(), "api.example.test,*.example.test");
    assert!(!used.interfaces.is_empty() && !used.pods.is_empty());
    let v4 = domain_set_name(def, false);

    let plain = render(&np);
    let Some(Object::Set(set)) = plain.object(&v4) else { panic!("no set {v4}") };
    assert!(set.timeout && set.elements.is_empty());
    assert!(plain.object(DNS_STEER_CHAIN).is_none(), "no steering without the proxy");
    let text = plain.to_text();
    assert!(text.contains(&format!("ip daddr @{v4} tcp dport 443 ct mark set ct mark | 0x02000000 goto egress-allowed")), "{text}");

    let options =
        RenderOptions { dns: Some(DnsSteer::new(15053, DNS_MARK, vec!["198.18.250.53/32".parse().unwrap()])), ..RenderOptions::DEFAULT };
    let steered = render_with(&np, &options);
    golden("domain-rules", &steered.to_text());
    let Some(Object::Set(proxied)) = steered.object(DNS_PROXIED) else { panic!() };
    assert_eq!(proxied.elements.len(), used.interfaces.len());
    // nft's own checks (the fake applies what the kernel would).
    let mut applier = Applier::new(FakeNft::new());
    applier.apply(&steered).unwrap();
    // Nothing learned: the domain rule admits nothing, the Deny decides.
    let traced = TracedCluster::build_with(&s, &options);
    assert_eq!(traced.reaches_address("y/a", "198.18.250.80".parse().unwrap(), crate::model::Protocol::Tcp, 443), Ok(false));
}

/// The table names its format; a listing tells which format wrote it.
#[test]
fn the_table_comment_names_the_ruleset_format() {
    assert!(TABLE_COMMENT.starts_with(&format!("flock ruleset format {RULESET_FORMAT}: ")));
    let listing = |comment: &str| format!("table inet flock {{\n\tcomment \"{comment}\"\n\tchain forward {{\n\t}}\n}}\n");
    assert_eq!(table_format(&listing(TABLE_COMMENT)), Some(RULESET_FORMAT));
    assert_eq!(table_format(&listing("flock ruleset format 7: from the future")), Some(7));
    // Before the marker.
    assert_eq!(
        table_format(&listing("flock: NetworkPolicy enforcement for the pods of this node; managed by flock-agent, edits are reverted")),
        Some(0)
    );
    assert_eq!(table_format(&listing("somebody else's")), None);
    assert_eq!(table_format("table inet flock {\n}\n"), None);
}

/// The set of every pod takes the pod CIDRs as ranges (an interval set); without any pod
/// CIDR it is the pods' addresses, an exact set (changed by its elements, not rewritten).
#[test]
fn every_pod_is_an_interval_set_only_with_pod_cidrs() {
    let policy = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {}}]}]";
    let every_pod = |s: &Snapshot| -> Set {
        let rs = render_node(s, "node-1");
        let set = rs.objects.iter().find_map(|o| match o {
            Object::Set(set) if set.name.contains("all-ns/all") => Some(set.clone()),
            _ => None,
        });
        set.unwrap_or_else(|| panic!("no set of every pod:\n{}", rs.to_text()))
    };
    let mut s = with(policy);
    let with_cidrs = every_pod(&s);
    assert!(with_cidrs.interval);
    assert_eq!(with_cidrs.elements.len(), 2, "the two nodes' /24s");
    for mut n in s.nodes().cloned().collect::<Vec<_>>() {
        n.pod_cidrs.clear();
        s.upsert_node(n);
    }
    let without = every_pod(&s);
    assert!(!without.interval);
    assert_eq!(without.elements.len(), 9, "the nine pods");
}

/// An Admin ClusterNetworkPolicy on namespace x's pods: `action` from the pods of `ns`
/// matching `labels`, on TCP `port` (`None`: every port).
fn admin_from(
    name: &str,
    priority: i32,
    action: &str,
    ns: &str,
    labels: serde_json::Value,
    port: Option<u16>,
) -> crate::model::cnp::ClusterNetworkPolicy {
    let from = if labels.is_null() {
        serde_json::json!([{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}])
    } else {
        serde_json::json!([{"pods": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}, "podSelector": {"matchLabels": labels}}}])
    };
    let mut rule = serde_json::json!({"name": "r", "action": action, "from": from});
    if let Some(p) = port {
        rule["protocols"] = serde_json::json!([{"tcp": {"destinationPort": {"number": p}}}]);
    }
    crate::model::cnp::from_json(&serde_json::json!({
        "metadata": {"name": name},
        "spec": {"tier": "Admin", "priority": priority, "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}, "ingress": [rule]},
    }))
    .unwrap()
}

/// The sets whose names mark them as shared by tier rules in a row, with their elements.
fn shared_sets(r: &Ruleset) -> Vec<(String, Vec<String>)> {
    r.objects
        .iter()
        .filter_map(|o| match o {
            Object::Set(s) if s.name.contains("-in-one") => Some((s.name.clone(), s.elements.iter().map(|e| e.key.to_string()).collect())),
            _ => None,
        })
        .collect()
}

/// Admin rules in a row with one verdict, the same ports and exact pod sets share one set and
/// one rule per pod; a rule on other ports, or of another verdict, stands alone. Incremental
/// renders follow a member's new pod and the run's end with what a full render gives.
/// (Verdicts: conformance case 227, through the tracer and real kernels.)
#[test]
fn tier_rules_in_a_row_with_one_verdict_share_one_set() {
    let mut s = testkit::base_cluster();
    for p in [
        admin_from("deny-y-blocked", 10, "Deny", "y", serde_json::json!({"blocked": "true"}), None),
        admin_from("deny-y-b", 11, "Deny", "y", serde_json::json!({"pod": "b"}), None),
        admin_from("deny-z-a", 12, "Deny", "z", serde_json::json!({"pod": "a"}), None),
        admin_from("deny-z-c-on-81", 13, "Deny", "z", serde_json::json!({"pod": "c"}), Some(81)),
        admin_from("accept-y", 14, "Accept", "y", serde_json::Value::Null, None),
    ] {
        s.upsert_cluster_policy(p);
    }
    s.record_changes();
    let endpoints = s.derived_endpoints("node-1");
    let options = Options::default();
    let mut inc = crate::translate::Incremental::new(&s, &endpoints, &options);
    let mut cache = RenderCache::new(RenderOptions::DEFAULT);
    let first = cache.render(inc.policy(), inc.changed());
    assert_eq!(first, render(&translate(&s, &endpoints, &options)));
    // y/b and z/a (nobody is labelled blocked yet).
    let sets = shared_sets(&first);
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0].1, ["198.18.1.22", "198.18.1.31"]);
    let text = first.to_text();
    let lookups = |text: &str, set: &str| text.lines().filter(|l| l.contains(&format!("@{set} "))).count();
    // One rule per pod of node-1 in namespace x (x/a, x/c), for the three policies.
    assert_eq!(lookups(&text, &sets[0].0), 2, "{text}");
    assert_eq!(text.matches("(3 rules in a row with one verdict: one set)").count(), 2, "{text}");
    // The rule on port 81 and the Accept stand alone.
    assert_eq!(text.lines().filter(|l| l.contains("tcp dport 81") && l.contains("deny-z-c-on-81")).count(), 2, "{text}");
    assert_eq!(text.lines().filter(|l| l.contains("comment \"accept-y ")).count(), 2, "{text}");

    // y/c is labelled blocked: the first policy's set gains it, and the shared one with it.
    let mut yc = s.pod_by_name(&testkit::pod_ref("y/c")).cloned().unwrap();
    yc.labels.insert("blocked", "true");
    s.upsert_pod(yc);
    let changes = s.take_changes();
    inc.update(&s, &endpoints, &changes);
    let second = cache.render(inc.policy(), inc.changed());
    assert_eq!(second, render(&translate(&s, &endpoints, &options)));
    let sets = shared_sets(&second);
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].1, ["198.18.1.22", "198.18.1.31", "198.18.2.23"]);

    // Two of the three gone: the first stands alone again, and the shared set goes.
    s.remove_cluster_policy("deny-y-b");
    s.remove_cluster_policy("deny-z-a");
    let changes = s.take_changes();
    inc.update(&s, &endpoints, &changes);
    let third = cache.render(inc.policy(), inc.changed());
    assert_eq!(third, render(&translate(&s, &endpoints, &options)));
    assert!(shared_sets(&third).is_empty());
}
