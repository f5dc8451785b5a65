//! `flockctl explain` end to end through the built binary: offline from manifests, and
//! `--live` from a node's table programmed in a network namespace.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/explain_policies.rs"]
mod explain_policies;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use explain_policies::POLICIES;
use flock::explain::{self, End, Query};
use flock::model::Protocol;
use flock::testkit::kernel::{NetnsGuard, require_root, sweep};
use flock::testkit::pod_ref;

fn flockctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flockctl")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// A scratch directory with the policies, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("flock-explain-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("policies.yaml"), POLICIES).unwrap();
        Self(d)
    }

    fn policies(&self) -> String {
        self.0.join("policies.yaml").to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const BASE: &str = "tests/conformance/base-cluster.yaml";

fn snapshot(scratch: &Scratch) -> flock::model::Snapshot {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    flock::source::files::load_manifests(&[root.join(BASE), PathBuf::from(scratch.policies())]).unwrap().to_snapshot()
}

#[test]
fn offline_json_and_text_name_the_deciding_rules() {
    let s = Scratch::new("offline");
    let out = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "80", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "Deny");
    let d = &v["ingress"]["deciding"][0];
    assert_eq!(
        (d["kind"].as_str(), d["name"].as_str(), d["rule"].as_u64(), d["action"].as_str()),
        (Some("ClusterNetworkPolicy"), Some("guard-x"), Some(0), Some("Deny"))
    );
    assert_eq!(d["rule_name"], "no-z");
    // The same answer as the library's.
    let snap = snapshot(&s);
    let q = Query { from: End::Pod(pod_ref("z/b")), to: End::Pod(pod_ref("x/a")), protocol: Protocol::Tcp, port: 80, family: None };
    assert_eq!(v, serde_json::to_value(explain::explain(&snap, &q).unwrap()).unwrap());

    let out = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "y/b", "--to", "x/a", "--port", "80"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.starts_with("Allow TCP/80 IPv4: y/b"), "{t}");
    assert!(
        t.contains("decided by: NetworkPolicy y/y-out rule 0: Allow") && t.contains("decided by: NetworkPolicy x/web rule 0: Allow"),
        "{t}"
    );

    // Bad input: a clear error, nothing on stdout.
    let out = flockctl(&["explain", "-f", BASE, "--from", "x/nope", "--to", "x/a", "--port", "80"]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(text(&out.stderr).contains("pod x/nope is not in the manifests"), "{}", text(&out.stderr));
    let out = flockctl(&["explain", "-f", BASE, "--from", "x/a", "--to", "x/b", "--port", "80", "--protocol", "ICMP"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("expected TCP, UDP or SCTP"), "{}", text(&out.stderr));
    let out = flockctl(&["explain", "--from", "x/a", "--to", "x/b", "--port", "80"]);
    assert!(!out.status.success(), "manifests or --live are required");
}

/// What a new user hit (issue #34): several paths after one `--manifests`, named ports,
/// an exit status that says the verdict, typos with suggestions, and plain messages.
#[test]
fn what_a_new_user_hit() {
    let s = Scratch::new("ux");
    // `--manifests a b`, as the synopsis `PATH...` reads; the same answer as `-f a -f b`.
    let one = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "80", "-o", "json"]);
    let two = flockctl(&["explain", "--manifests", BASE, &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "80", "-o", "json"]);
    assert!(two.status.success(), "{}", text(&two.stderr));
    assert_eq!(one.stdout, two.stdout);

    // A named port is resolved on the destination pod, per protocol.
    let named =
        flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "serve-80-tcp", "-o", "json"]);
    assert!(named.status.success(), "{}", text(&named.stderr));
    assert_eq!(named.stdout, one.stdout);
    let v: serde_json::Value = serde_json::from_slice(&named.stdout).unwrap();
    assert_eq!(v["port"], 80);
    let wrong = flockctl(&["explain", "-f", BASE, "--from", "z/b", "--to", "x/a", "--port", "serve-80-tcp", "--protocol", "UDP"]);
    assert_eq!(wrong.status.code(), Some(2));
    let e = text(&wrong.stderr);
    assert!(e.contains("pod x/a declares no UDP port of that name") && e.contains("serve-80-udp (UDP 80)"), "{e}");
    let zero = flockctl(&["explain", "-f", BASE, "--from", "z/b", "--to", "x/a", "--port", "0"]);
    assert!(text(&zero.stderr).contains("a port is 1 to 65535"), "{}", text(&zero.stderr));

    // --exit-code: 1 on Deny, 0 on Allow; errors exit 2 either way.
    let deny = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "80", "--exit-code"]);
    assert_eq!(deny.status.code(), Some(1), "{}", text(&deny.stderr));
    assert!(text(&deny.stdout).starts_with("Deny"));
    let plain = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "z/b", "--to", "x/a", "--port", "80"]);
    assert_eq!(plain.status.code(), Some(0));
    let allow = flockctl(&["explain", "-f", BASE, "-f", &s.policies(), "--from", "y/b", "--to", "x/a", "--port", "80", "--exit-code"]);
    assert_eq!(allow.status.code(), Some(0), "{}", text(&allow.stderr));
    let bad = flockctl(&["explain", "-f", BASE, "--from", "x/nope", "--to", "x/a", "--port", "80", "--exit-code"]);
    assert_eq!(bad.status.code(), Some(2));

    // A destination that is no pod: its ingress is not enforced, said as such.
    let out = flockctl(&["explain", "-f", BASE, "--from", "x/a", "--to", "198.19.255.1", "--port", "80"]);
    let t = text(&out.stdout);
    assert!(t.contains("ingress: not enforced (Allow)"), "{t}");

    // Typos get a suggestion.
    let out = flockctl(&["explian"]);
    assert!(text(&out.stderr).contains("a similar subcommand exists: 'explain'"), "{}", text(&out.stderr));
    let out = flockctl(&["explain", "-f", BASE, "--from", "x/a", "--to", "x/b", "--prot", "80"]);
    assert!(text(&out.stderr).contains("a similar argument exists: '--port'"), "{}", text(&out.stderr));

    // render --node on manifests that name no node.
    let out = flockctl(&["render", "-f", &s.policies(), "--node", "node-1"]);
    let e = text(&out.stderr);
    assert!(e.contains("the manifests name no node") && !e.contains("known nodes: )"), "{e}");
}

#[test]
fn live_explains_from_the_table_in_the_kernel() {
    if !require_root("live_explains_from_the_table_in_the_kernel") {
        return;
    }
    sweep();
    let s = Scratch::new("live");
    let snap = snapshot(&s);
    let render = flockctl(&["render", "-f", BASE, "-f", &s.policies(), "--node", "node-1"]);
    assert!(render.status.success(), "{}", text(&render.stderr));
    let file = s.0.join("node-1.nft");
    std::fs::write(&file, &render.stdout).unwrap();
    let ns = NetnsGuard::new("explain");
    ns.exec(&["nft", "-f", file.to_str().unwrap()]);

    let pods = flock::testkit::BASE_PODS;
    let on_node_1 = |p: &str| snap.pod_by_name(&pod_ref(p)).unwrap().node.as_deref() == Some("node-1");
    let mut checked = 0;
    for from in pods {
        for to in pods {
            if from == to || !(on_node_1(from) || on_node_1(to)) {
                continue;
            }
            let q = Query { from: End::Pod(pod_ref(from)), to: End::Pod(pod_ref(to)), protocol: Protocol::Tcp, port: 80, family: None };
            let offline = explain::explain(&snap, &q).unwrap();
            // This node's part of the verdict.
            let mut want = explain::Verdict::Allow;
            if on_node_1(from) && offline.egress.verdict == explain::Verdict::Deny {
                want = explain::Verdict::Deny;
            }
            if on_node_1(to) && offline.ingress.verdict == explain::Verdict::Deny {
                want = explain::Verdict::Deny;
            }
            // Local pods by name, the remote end by address.
            let arg = |p: &str, info: &explain::EndInfo| if on_node_1(p) { p.to_string() } else { info.address.to_string() };
            let (f, t) = (arg(from, &offline.from), arg(to, &offline.to));
            let out =
                ns.try_exec(&[env!("CARGO_BIN_EXE_flockctl"), "explain", "--live", "--from", &f, "--to", &t, "--port", "80", "-o", "json"]);
            assert!(out.status.success(), "{from} -> {to}: {}", text(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                v["verdict"].as_str(),
                Some(want.to_string().as_str()),
                "{from} -> {to}: {v:#}\noffline:\n{}",
                explain::to_text(&offline)
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked}");

    // The text names the policy rule that decided.
    let out = ns.try_exec(&[env!("CARGO_BIN_EXE_flockctl"), "explain", "--live", "--from", "198.18.2.32", "--to", "x/a", "--port", "80"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.starts_with("Deny on this node"), "{t}");
    assert!(t.contains("guard-x ingress[0] no-z: Deny"), "{t}");
    // The node's own address (node-1's InternalIP, on this namespace's loopback): y/b's
    // packet to it is judged through hook input by y/b's egress (it may reach x only), x/a's
    // is not restricted, and the node's own packet to x/a is not policed.
    ns.exec(&["ip", "addr", "add", "198.18.0.1/32", "dev", "lo"]);
    let live = |from: &str, to: &str| {
        let out = ns.try_exec(&[env!("CARGO_BIN_EXE_flockctl"), "explain", "--live", "--from", from, "--to", to, "--port", "10250"]);
        assert!(out.status.success(), "{from} -> {to}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let t = live("y/b", "198.18.0.1");
    assert!(t.starts_with("Deny on this node") && t.contains("the source's egress policy decides (hook input)"), "{t}");
    assert!(t.contains("egress-") && t.contains("ingress: none (the destination is the node itself)"), "{t}");
    let offline = explain::explain(
        &snap,
        &Query {
            from: End::Pod(pod_ref("y/b")),
            to: End::Address("198.18.0.1".parse().unwrap()),
            protocol: Protocol::Tcp,
            port: 10250,
            family: None,
        },
    )
    .unwrap();
    assert_eq!(offline.verdict, explain::Verdict::Deny, "{}", explain::to_text(&offline));
    assert!(live("x/a", "198.18.0.1").starts_with("Allow on this node"));
    let t = live("198.18.0.1", "x/a");
    assert!(t.starts_with("Allow on this node") && t.contains("is this node's own address: what the node sends its pods"), "{t}");

    // A node without flock's table says so.
    let empty = NetnsGuard::new("explain-empty");
    let out = empty.try_exec(&[env!("CARGO_BIN_EXE_flockctl"), "explain", "--live", "--from", "x/a", "--to", "x/b", "--port", "80"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no table inet flock"), "{}", text(&out.stderr));
}
