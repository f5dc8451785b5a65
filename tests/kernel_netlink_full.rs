//! The full sync as one netlink batch (`src/apply/netlink/full.rs`) against nft, in
//! throwaway network namespaces (root only). For the renders of every conformance case (each
//! step, both nodes, IPv4 and dual-stack, both ruleset shapes) and of a synthetic cluster
//! with ClusterNetworkPolicies, the table the batch writes lists byte for byte as the table
//! nft writes from the script: into a new table, as a forced resync over the previous render
//! (flushes, deletions of sets and stale objects), and as the incremental transaction from
//! the previous render where there is one. A batch the kernel refuses changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use flock::apply::kernel::NftCli;
use flock::apply::{Backend, incremental_steps, steps_script, transaction};
use flock::model::Snapshot;
use flock::nft::parse::Kind;
use flock::render::{Object, RenderOptions, Ruleset, render_with};
use flock::testkit::kernel::{NetnsGuard, require_root};
use flock::translate::{Options, translate};

const PORT_SETS: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ports, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: 80}, {port: 81}, {port: 443}, {port: 8000, endPort: 8080}, {port: 8050, endPort: 8090}]
  - ports: [{port: 53, protocol: UDP}, {port: 5353, protocol: UDP}, {port: 9, protocol: SCTP}, {port: 11, endPort: 20, protocol: SCTP}]
  egress:
  - to: [{ipBlock: {cidr: 198.18.0.0/15}}]
    ports: [{port: 1}, {port: 65535}, {port: 2, endPort: 5}, {port: 65000, endPort: 65534}, {port: 7}]
";

/// Every pod of `s` gets an IPv6 address beside its IPv4 one.
fn dual_stack(s: &Snapshot) -> Snapshot {
    let mut s = s.clone();
    let pods: Vec<_> = s.pods().cloned().collect();
    for mut p in pods {
        let v6: Vec<IpAddr> = p
            .ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => {
                    let o = v4.octets();
                    Some(format!("2001:db8:{:x}:{:x}::{:x}", o[1], o[2], o[3]).parse().unwrap())
                }
                IpAddr::V6(_) => None,
            })
            .collect();
        p.ips.extend(v6);
        s.upsert_pod(p);
    }
    s
}

/// `s` with every other NetworkPolicy and ClusterNetworkPolicy, and namespace z, in audit
/// mode (the audit chains, maps and base chain in the renders).
fn half_audited(s: &Snapshot) -> Snapshot {
    let mut out = s.clone();
    for (i, p) in s.policies().enumerate() {
        out.upsert_policy(flock::model::NetworkPolicy { audit: i % 2 == 0, ..p.clone() });
    }
    for (i, p) in s.cluster_policies().enumerate() {
        out.upsert_cluster_policy(flock::model::cnp::ClusterNetworkPolicy { audit: i % 2 == 1, ..p.clone() });
    }
    if let Some(z) = s.namespace("z") {
        out.upsert_namespace(flock::model::Namespace { audit: true, ..z.clone() });
    }
    out
}

/// A NetworkPolicy with the `flock.dev/egress-domains` annotation (beside a domain CNP).
const DOMAINS_NP: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: z-by-name
  namespace: z
  annotations:
    flock.dev/egress-domains: '[{"name": "github.com", "ports": [{"port": 443}]}, {"name": "*.pypi.org"}]'
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 198.18.250.53/32}}], ports: [{protocol: UDP, port: 53}]}]
"#;

/// Distinct renders, in a fixed order.
fn renders() -> Vec<(String, Ruleset)> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |name: String, rs: Ruleset| {
        if seen.insert(rs.to_text()) {
            out.push((name, rs));
        }
    };
    let shapes = [
        ("rules", RenderOptions { peer_classes_from: usize::MAX, ..RenderOptions::DEFAULT }),
        ("classes", RenderOptions { peer_classes_from: 0, ..RenderOptions::DEFAULT }),
    ];
    let cases = flock::source::files::find_cases(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")]).unwrap();
    for dir in cases {
        let case = flock::source::files::load_case(&dir).unwrap();
        let mut s = flock::testkit::base_cluster();
        for (i, step) in case.steps.iter().enumerate() {
            flock::conformance::apply_step(&mut s, step);
            let audit = Options { audit_mode: true, ..Options::default() };
            for (stack, snap, options) in
                [("v4", s.clone(), Options::default()), ("dual", dual_stack(&s), Options::default()), ("audit", half_audited(&s), audit)]
            {
                for node in ["node-1", "node-2"] {
                    let ir = translate(&snap, &snap.derived_endpoints(node), &options);
                    for (shape, opts) in &shapes {
                        add(format!("{}[{i}] {stack} {node} {shape}", case.dir_name), render_with(&ir, opts));
                    }
                }
            }
        }
    }
    // Several ports per rule: sets of ports in the rule (with and without ranges).
    let mut s = flock::testkit::base_cluster();
    for p in flock::testkit::policies(PORT_SETS) {
        s.upsert_policy(p);
    }
    for (stack, snap) in [("v4", s.clone()), ("dual", dual_stack(&s))] {
        for node in ["node-1", "node-2"] {
            let ir = translate(&snap, &snap.derived_endpoints(node), &Options::default());
            for (shape, opts) in &shapes {
                add(format!("port sets {stack} {node} {shape}"), render_with(&ir, opts));
            }
        }
    }
    // Domain rules: their timed sets, the rules marking what they admit, and the DNS
    // steering (prerouting base chains, packet marks, tproxy).
    let cnp = flock::testkit::domain_policy("y", &["*.example.test", "api.example.org"], 443);
    let s = flock::testkit::base_cluster_with(&format!("{cnp}---\n{DOMAINS_NP}"));
    let steer = flock::render::DnsSteer::new(
        15053,
        flock::render::DNS_MARK,
        vec!["198.18.250.53/32".parse().unwrap(), "2001:db8:250::53/128".parse().unwrap()],
    );
    for (stack, snap) in [("v4", s.clone()), ("dual", dual_stack(&s))] {
        for node in ["node-1", "node-2"] {
            let ir = translate(&snap, &snap.derived_endpoints(node), &Options::default());
            for (shape, opts) in &shapes {
                let opts = RenderOptions { dns: Some(steer.clone()), ..opts.clone() };
                add(format!("domains {stack} {node} {shape}"), render_with(&ir, &opts));
            }
        }
    }
    // An overlay: VXLAN taken from the nodes only, carrying their pods' packets.
    let s = dual_stack(&flock::testkit::base_cluster());
    for node in ["node-1", "node-2"] {
        let overlay = Options { overlay_port: Some(4789), overlay_node: Some(node.into()), ..Options::default() };
        let ir = translate(&s, &s.derived_endpoints(node), &overlay);
        add(format!("overlay dual {node}"), render_with(&ir, &RenderOptions::default()));
    }
    let mut p = flock::synth::Params::new(2_000, 200);
    (p.admin_policies, p.baseline_policies) = (20, 5);
    let cluster = flock::synth::generate(&p);
    let ir = translate(&cluster.snapshot, &cluster.snapshot.derived_endpoints(&cluster.node), &Options::default());
    add("synthetic 2k/200 + CNPs".into(), render_with(&ir, &RenderOptions::default()));
    out
}

fn objects(rs: &Ruleset) -> BTreeSet<(Kind, String)> {
    rs.objects
        .iter()
        .map(|o| {
            let kind = match o {
                Object::Chain(_) => Kind::Chain,
                Object::Set(s) if s.data.is_some() => Kind::Map,
                Object::Set(_) => Kind::Set,
            };
            (kind, o.name().to_string())
        })
        .collect()
}

fn listing(ns: &NetnsGuard) -> String {
    NftCli::new(ns.netns()).list_table().unwrap().unwrap()
}

#[test]
fn netlink_transactions_list_as_nft_writes_them() {
    if !require_root("netlink_transactions_list_as_nft_writes_them") {
        return;
    }
    let renders = renders();
    assert!(renders.len() > 100, "{} renders", renders.len());
    // Sets of ports in rules, interval and not, are among them.
    let all: String = renders.iter().map(|(_, r)| r.to_text()).collect();
    for want in
        ["tcp dport { 80-81, 443, 8000-8090 }", "udp dport { 53, 5353 }", "sctp dport { 9, 11-20 }", "tcp dport { 1-5, 7, 65000-65535 }"]
    {
        assert!(all.contains(want), "no render has {want}");
    }
    // And domain rules with the DNS steering.
    for want in [
        "flags timeout",
        "tproxy ip to 127.0.0.1:15053",
        "tproxy ip6 to [::1]:15053",
        "meta mark set meta mark | 0x00000080",
        "ct mark set ct mark | 0x02000000",
        "ct direction reply ct mark & 0x04000000 == 0x04000000",
        "type filter hook output priority mangle; policy accept;",
        "icmpv6 type nd-neighbor-solicit ip6 hoplimit 255 iifname . ip6 saddr @pod-nd-sources accept",
        "icmpv6 type nd-neighbor-solicit iifname . ip6 saddr @pod-addrs-v6 counter drop",
        "icmpv6 type mld2-listener-report ip6 hoplimit 1 iifname . ip6 saddr @pod-nd-sources accept",
        // A set whose elements each have a limiter.
        "limit rate 10/second burst 50 packets",
        "udp dport 4789 jump overlay-in",
        "@th,224,16 0x800 ip saddr . @th,336,32 @overlay-v4-in-v4 return",
        "@th,224,16 0x86dd ip6 saddr . @th,304,128 @overlay-v6-in-v6 return",
        "typeof ip6 saddr . @th,336,32",
        "ip daddr @overlay-nodes-v4 udp dport 4789",
    ] {
        assert!(all.contains(want), "no render has {want}");
    }
    // So are the audit mode's chains (a base chain at priority filter - 1) and log rules.
    for want in
        ["type filter hook forward priority filter - 1; policy accept;", "log prefix \"flock:audit:egress:", "log prefix \"flock:deny:"]
    {
        assert!(all.contains(want), "no render has {want}");
    }
    let (by_netlink, by_nft) = (NetnsGuard::new("nlfull"), NetnsGuard::new("nlfullref"));
    // No nft binary: a render the batch cannot carry fails here instead of going through nft.
    let mut netlink = NftCli::new(by_netlink.netns()).with_program("/nonexistent/nft");
    let mut nft = NftCli::new(by_nft.netns());
    let mut previous: Option<&Ruleset> = None;
    let (mut full, mut incremental) = (0, 0);
    for (i, (name, rs)) in renders.iter().enumerate() {
        let text = rs.to_text();
        // From one render to the next, in turn: the incremental transaction where there is
        // one, and the full sync over what the table holds (a forced resync).
        match previous.filter(|_| i % 2 == 1).and_then(|p| incremental_steps(p, rs)) {
            Some(steps) => {
                netlink.write_steps(&steps, rs).unwrap_or_else(|e| panic!("{name}: {e}"));
                nft.run(&steps_script(&steps)).unwrap_or_else(|e| panic!("{name}: nft: {e}"));
                incremental += 1;
            }
            None => {
                let existing = previous.map(objects).unwrap_or_default();
                netlink.write_full(rs, &existing, &text).unwrap_or_else(|e| panic!("{name}: {e}"));
                let script = if existing.is_empty() { text.clone() } else { transaction(rs, &existing, &text) };
                nft.run(&script).unwrap_or_else(|e| panic!("{name}: nft: {e}"));
                full += 1;
            }
        }
        let (a, b) = (listing(&by_netlink), listing(&by_nft));
        if a != b {
            let first = a.lines().zip(b.lines()).position(|(x, y)| x != y).unwrap_or(0);
            panic!(
                "{name}: the netlink batch lists differently (line {}):\nnetlink: {}\nnft:     {}",
                first + 1,
                a.lines().nth(first).unwrap_or(""),
                b.lines().nth(first).unwrap_or("")
            );
        }
        // And both hold exactly the render.
        assert_eq!(flock::nft::canonical(&a).unwrap(), flock::nft::canonical(&text).unwrap(), "{name}");
        previous = Some(rs);
    }
    assert!(full > 100 && incremental > 100, "{full} full syncs, {incremental} incremental transactions");
}

/// A batch the kernel refuses (a rule that jumps to a chain the table lacks) is refused as a
/// whole: the table keeps what it held, and the error names the chain.
#[test]
fn a_refused_full_batch_changes_nothing() {
    if !require_root("a_refused_full_batch_changes_nothing") {
        return;
    }
    let renders = renders();
    let (_, first) = &renders[0];
    let (_, second) = &renders[renders.len() - 1];
    let ns = NetnsGuard::new("nlfullbad");
    let mut netlink = NftCli::new(ns.netns()).with_program("/nonexistent/nft");
    netlink.write_full(first, &BTreeSet::new(), &first.to_text()).unwrap();
    let before = listing(&ns);
    let mut broken = second.clone();
    let Some(Object::Chain(c)) = broken.objects.iter_mut().rev().find(|o| matches!(o, Object::Chain(c) if c.hook.is_none())) else {
        panic!("no regular chain")
    };
    std::sync::Arc::make_mut(&mut c.rules).push(flock::render::Rule::verdict(flock::render::Verdict::Jump("no-such-chain".into())));
    let name = c.name.clone();
    let e = netlink.write_full(&broken, &objects(first), &broken.to_text()).unwrap_err();
    assert!(e.to_string().contains(&name), "{e}");
    assert_eq!(listing(&ns), before, "a refused batch changed the table");
}
