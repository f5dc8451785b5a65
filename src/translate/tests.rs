//! Table-driven translator tests on the upstream e2e model (see `testkit`). Each case names
//! the semantics item it covers and asserts the IR through `testkit::summary`.

use super::*;
use crate::model::{LocalEndpoint, PodPhase, Snapshot};
use crate::testkit::{self, summary};

/// Translates with every base pod as a local endpoint (the translator does not care which
/// node an endpoint is on).
fn run(snapshot: &Snapshot) -> NodePolicy {
    let eps: Vec<LocalEndpoint> = snapshot.pods().filter(|p| p.is_peer()).map(LocalEndpoint::for_pod).collect();
    translate(snapshot, &eps, &Options::default())
}

fn with(policies: &str) -> Snapshot {
    let mut s = testkit::base_cluster();
    for p in testkit::policies(policies) {
        s.upsert_policy(p);
    }
    s
}

struct Case {
    name: &'static str,
    policies: &'static str,
    /// (pod, direction, expected summary)
    expect: &'static [(&'static str, Direction, &'static str)],
}

const I: Direction = Direction::Ingress;
const E: Direction = Direction::Egress;

const CASES: &[Case] = &[
    Case { name: "no policy: nothing isolated", policies: "", expect: &[("x/a", I, "open"), ("x/a", E, "open")] },
    Case {
        name: "default deny ingress isolates every pod of the namespace, not egress, not other namespaces",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}",
        expect: &[("x/a", I, "isolated: "), ("x/c", I, "isolated: "), ("x/a", E, "open"), ("y/a", I, "open")],
    },
    Case {
        name: "policyTypes defaults: Egress only when egress rules exist",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress: [{}]",
        expect: &[("x/a", I, "isolated: "), ("x/a", E, "isolated: * *"), ("x/b", I, "open")],
    },
    Case {
        name: "explicit policyTypes Egress with no rules denies all egress and leaves ingress open",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  ingress: [{}]",
        expect: &[("x/a", I, "open"), ("x/a", E, "isolated: ")],
    },
    Case {
        name: "empty from and empty ports allow everything (ICMP included)",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [], ports: []}]",
        expect: &[("x/b", I, "isolated: * *")],
    },
    Case {
        name: "podSelector peer selects in the policy's namespace only",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]",
        expect: &[("x/a", I, "isolated: [x/b] *")],
    },
    Case {
        name: "namespaceSelector peer selects every pod of the matching namespaces",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]",
        expect: &[("x/a", I, "isolated: [y/a,y/b,y/c] *")],
    },
    Case {
        name: "namespaceSelector and podSelector in one peer are ANDed; in two peers ORed",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: and, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: or, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}, {podSelector: {matchLabels: {pod: b}}}]}]",
        expect: &[("x/a", I, "isolated: [y/b] *"), ("x/b", I, "isolated: [x/b] *; [y/a,y/b,y/c] *")],
    },
    Case {
        name: "empty namespaceSelector means all namespaces",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}]}]",
        expect: &[("x/a", I, "isolated: [x/c,y/c,z/c] *")],
    },
    Case {
        name: "matchExpressions In, NotIn, Exists, DoesNotExist",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: In, values: [a, b]}]}
  ingress:
  - from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x, y]}]}}]
  - from: [{podSelector: {matchExpressions: [{key: pod, operator: Exists}, {key: missing, operator: DoesNotExist}]}}]",
        expect: &[
            ("x/a", I, "isolated: [z/a,z/b,z/c] *; [x/a,x/b,x/c] *"),
            ("x/b", I, "isolated: [z/a,z/b,z/c] *; [x/a,x/b,x/c] *"),
            ("x/c", I, "open"),
        ],
    },
    Case {
        name: "allows are the union over every selecting policy",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p1, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p2, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: c}}}], ports: [{port: 81, protocol: UDP}]}]",
        expect: &[("x/a", I, "isolated: [x/b] TCP:80; [x/c] UDP:81"), ("x/b", I, "isolated: [x/b] TCP:80")],
    },
    Case {
        name: "ports: default TCP, protocol-only, endPort ranges, SCTP",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 80}, {port: 81}, {protocol: UDP}, {protocol: SCTP, port: 8000, endPort: 9000}]}]",
        expect: &[("x/a", I, "isolated: * TCP:80-81; * UDP:*; * SCTP:8000-9000")],
    },
    Case {
        name: "ingress named ports resolve on the local pod by name and protocol",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: serve-81-udp, protocol: UDP}]
  - ports: [{port: serve-81-udp}]
  - ports: [{port: no-such-port}]",
        expect: &[("x/a", I, "isolated: * UDP:81")],
    },
    Case {
        name: "egress named ports resolve on each destination pod",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: serve-80-tcp}]",
        expect: &[("x/a", E, "isolated: [x/b:tcp/80]")],
    },
    Case {
        name: "egress named port without peers reaches every pod declaring it",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: y}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{ports: [{port: serve-81-sctp, protocol: SCTP}]}]",
        expect: &[(
            "y/a",
            E,
            "isolated: [x/a:sctp/81,x/b:sctp/81,x/c:sctp/81,y/a:sctp/81,y/b:sctp/81,y/c:sctp/81,z/a:sctp/81,z/b:sctp/81,z/c:sctp/81]",
        )],
    },
    Case {
        name: "ipBlock with except, applied to pod addresses too",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{ipBlock: {cidr: 198.18.2.0/24, except: [198.18.2.12/32]}}]}]",
        expect: &[(
            "x/a",
            I,
            "isolated: [198.18.2.0/29,198.18.2.128/25,198.18.2.13/32,198.18.2.14/31,198.18.2.16/28,198.18.2.32/27,198.18.2.64/26,198.18.2.8/30] *",
        )],
    },
    Case {
        name: "egress ipBlock with a named port admits only the pods inside the block",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 198.18.1.0/24, except: [198.18.1.11/32]}}], ports: [{port: serve-80-tcp}]}]",
        expect: &[("x/a", E, "isolated: [x/c:tcp/80,y/b:tcp/80,z/a:tcp/80,z/c:tcp/80]")],
    },
    Case {
        name: "an identical rule in two policies is one rule",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p1, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p2, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchExpressions: [{key: pod, operator: In, values: [b]}]}}]}]",
        expect: &[("x/a", I, "isolated: [x/b] *")],
    },
    Case {
        name: "an invalid rule allows nothing but the policy still isolates",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{ipBlock: {cidr: 198.18.0.0/16, except: [10.0.0.0/8]}}]
  - ports: [{port: 80, endPort: 79}]
  - from: [{podSelector: {matchLabels: {pod: b}}}]",
        expect: &[("x/a", I, "isolated: [x/b] *")],
    },
    Case {
        // The security defect of issue 11: a widened selector must not carry its allows.
        name: "an invalid podSelector isolates the whole namespace and its rules allow nothing",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-db, namespace: x}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: a}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: x}
spec:
  podSelector: {matchLabels: {pod: \"web-\"}}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{}]",
        expect: &[
            ("x/a", I, "isolated: "),
            ("x/b", I, "isolated: "),
            ("x/c", I, "isolated: [x/a] *"),
            ("x/a", E, "isolated: "),
            ("y/a", I, "open"),
        ],
    },
    Case {
        name: "an unknown matchExpressions operator in podSelector fails closed the same way",
        policies: "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: y}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: Like, values: [a]}]}
  ingress: [{from: [{namespaceSelector: {}}]}]",
        expect: &[("y/a", I, "isolated: "), ("y/c", I, "isolated: "), ("y/a", E, "open"), ("x/a", I, "open")],
    },
];

#[test]
fn semantics_table() {
    for case in CASES {
        let np = run(&with(case.policies));
        for (pod, dir, want) in case.expect {
            assert_eq!(summary(&np, pod, *dir), *want, "case {:?}: {pod} {dir}", case.name);
        }
    }
}

#[test]
fn invalid_policies_are_reported_with_namespace_name_and_reason() {
    let np = run(&with(CASES.iter().find(|c| c.name.starts_with("an invalid rule")).unwrap().policies));
    let msgs: Vec<String> = np.problems.iter().map(ToString::to_string).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(
        msgs[0].starts_with("NetworkPolicy x/p: spec.ingress[0].from[0].ipBlock.except[0]: 10.0.0.0/8 must be a strict subset"),
        "{msgs:?}"
    );
    assert!(msgs[1].starts_with("NetworkPolicy x/p: spec.ingress[1].ports[0].endPort: 79 must be greater"), "{msgs:?}");
}

#[test]
fn terminal_hostnetwork_and_addressless_pods_are_not_peers() {
    let mut s = with(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]",
    );
    let uids: Vec<String> = s.pods_in("y").map(|p| p.uid.clone()).collect();
    let [ya, yb, yc] = <[String; 3]>::try_from(uids).unwrap();
    let mut edit = |uid: &str, f: &dyn Fn(&mut crate::model::Pod)| {
        let mut p = s.pod(uid).unwrap().clone();
        f(&mut p);
        s.upsert_pod(p);
    };
    edit(&ya, &|p| p.phase = PodPhase::Succeeded);
    edit(&yb, &|p| p.host_network = true);
    edit(&yc, &|p| p.ips.clear());
    let np = run(&s);
    assert_eq!(summary(&np, "x/a", I), "isolated: [] *");
}

#[test]
fn dual_stack_pods_contribute_both_families() {
    let mut s = with(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]",
    );
    let mut b = s.pod_by_name(&testkit::pod_ref("x/b")).unwrap().clone();
    b.ips.push("2001:db8:2::12".parse().unwrap());
    s.upsert_pod(b);
    let np = run(&s);
    let (def, set) = np.peer_sets.iter().next().unwrap();
    assert!(matches!(def, PeerDef::Pods { .. }));
    assert_eq!(set.v4.len(), 1);
    assert_eq!(set.v6.len(), 1);
}

#[test]
fn endpoint_of_an_unknown_pod_is_closed_both_ways() {
    let s = testkit::base_cluster();
    let ep = LocalEndpoint {
        interface: flock_cni::host_interface_name("cid", "eth0"),
        container_id: "cid".into(),
        pod: testkit::pod_ref("x/ghost"),
        pod_uid: None,
        addrs: vec!["198.18.1.99".parse().unwrap()],
    };
    let np = translate(&s, &[ep], &Options::default());
    assert_eq!(np.endpoints[0].ingress.isolated_by, vec![Isolation::UnknownPod]);
    assert_eq!(np.endpoints[0].egress.isolated_by, vec![Isolation::UnknownPod]);
    assert!(np.endpoints[0].ingress.rules.is_empty());
}

#[test]
fn endpoint_uid_must_match_the_pod() {
    let s = testkit::base_cluster();
    let pod = s.pod_by_name(&testkit::pod_ref("x/a")).unwrap();
    let mut ep = LocalEndpoint::for_pod(pod);
    ep.pod_uid = Some("another-sandbox-of-a-deleted-pod".into());
    let np = translate(&s, &[ep], &Options::default());
    assert_eq!(np.endpoints[0].ingress.isolated_by, vec![Isolation::UnknownPod]);
}

#[test]
fn run_pods_are_egress_isolated_until_a_policy_allows() {
    let mut s = testkit::base_cluster();
    let mut a = s.pod_by_name(&testkit::pod_ref("x/a")).unwrap().clone();
    a.labels.insert(RUN_LABEL, "r1");
    s.upsert_pod(a);
    let np = run(&s);
    assert_eq!(summary(&np, "x/a", E), "isolated: ");
    assert_eq!(summary(&np, "x/a", I), "open");
    let eps: Vec<LocalEndpoint> = s.pods().map(LocalEndpoint::for_pod).collect();
    let np = translate(&s, &eps, &Options { isolate_run_pods: false, ..Options::default() });
    assert_eq!(summary(&np, "x/a", E), "open");

    for p in testkit::policies(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: r1-egress, namespace: x}
spec:
  podSelector: {matchLabels: {flock.dev/run: r1}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}}]}]",
    ) {
        s.upsert_policy(p);
    }
    let np = run(&s);
    assert_eq!(summary(&np, "x/a", E), "isolated: [x/b] *");
}

#[test]
fn equal_peer_definitions_share_one_set() {
    let np = run(&with(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p1, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 80}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p2, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 81}]}]",
    ));
    assert_eq!(np.peer_sets.len(), 1);
}

#[test]
fn translation_is_deterministic() {
    let s = with(CASES[10].policies);
    assert_eq!(run(&s), run(&s));
}

#[test]
fn endpoints_claiming_one_interface_resolve_whatever_their_order() {
    // Found by the `pipeline` fuzzer (fuzz/corpus/pipeline/repro-duplicate-interface): the
    // first of two endpoints with one interface used to win, so the input order decided.
    let s = testkit::base_cluster();
    let a = LocalEndpoint::for_pod(s.pod_by_name(&testkit::pod_ref("x/a")).unwrap());
    let mut ghost = a.clone();
    ghost.container_id = "stale-sandbox".into();
    ghost.pod = testkit::pod_ref("y/ghost");
    ghost.pod_uid = None;
    let forward = translate(&s, &[a.clone(), ghost.clone()], &Options::default());
    let backward = translate(&s, &[ghost, a], &Options::default());
    assert_eq!(forward, backward);
    assert_eq!(forward.endpoints.len(), 1);
}

const FROM_Y: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]";

/// The addresses (with their pod comment) of x/a's only ingress peer set.
fn ingress_peers(np: &NodePolicy) -> Vec<(String, String)> {
    let key = testkit::pod_ref("x/a");
    let ep = np.endpoints.iter().find(|e| e.pod == key).unwrap();
    let PeerMatch::Addresses(def) = &ep.ingress.rules[0].peer else { panic!("not a peer set") };
    let set = &np.peer_sets[def];
    set.v4
        .iter()
        .map(|(n, c)| (n.addr().to_string(), c.clone()))
        .chain(set.v6.iter().map(|(n, c)| (n.addr().to_string(), c.clone())))
        .collect()
}

fn pod_named(s: &Snapshot, name: &str) -> crate::model::Pod {
    s.pod_by_name(&testkit::pod_ref(name)).unwrap().clone()
}

#[test]
fn a_reused_address_belongs_to_the_newer_live_pod_only() {
    let mut s = with(FROM_Y);
    let mut old = pod_named(&s, "y/a");
    old.created = Some(1_000);
    s.upsert_pod(old.clone());
    // A new pod in x was given y/a's address while y/a's status has not caught up yet
    // (y/a is gone or being deleted): the newer pod owns the address.
    let mut new = pod_named(&s, "x/b");
    new.uid = "uid-new".into();
    new.name = "new".into();
    new.ips = old.ips.clone();
    new.created = Some(2_000);
    s.upsert_pod(new.clone());
    let ip = old.ips[0].to_string();
    let np = translate(&s, &[], &Options::default());
    assert!(np.peer_sets.is_empty(), "no local endpoint, nothing computed");
    let eps = vec![LocalEndpoint::for_pod(&pod_named(&s, "x/a"))];
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(!peers.iter().any(|(a, _)| *a == ip), "y/a no longer owns {ip}: {peers:?}");
    assert_eq!(peers.len(), 2, "y/b and y/c remain: {peers:?}");

    // Make y/a the newer one: exactly one pod gets the address, whichever order the pods
    // were upserted in.
    old.created = Some(3_000);
    s.upsert_pod(old.clone());
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(peers.contains(&(ip.clone(), "y/a".into())), "{peers:?}");

    // A terminal pod never competes.
    new.created = Some(4_000);
    new.phase = PodPhase::Succeeded;
    s.upsert_pod(new);
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(peers.contains(&(ip, "y/a".into())), "{peers:?}");
}

#[test]
fn a_local_endpoint_is_authoritative_for_its_pods_addresses() {
    let mut s = with(FROM_Y);
    // y/a's status has no address yet; its endpoint on this node has one. A stale pod in
    // the API (newer, even) still reports that address.
    let mut ya = pod_named(&s, "y/a");
    let cni_ip: std::net::IpAddr = "198.18.7.7".parse().unwrap();
    ya.ips.clear();
    s.upsert_pod(ya.clone());
    let mut stale = pod_named(&s, "y/b");
    stale.uid = "uid-stale".into();
    stale.name = "stale".into();
    stale.ips = vec![cni_ip];
    stale.created = Some(i64::MAX);
    s.upsert_pod(stale);
    let mut ep_ya = LocalEndpoint::for_pod(&ya);
    ep_ya.addrs = vec![cni_ip];
    let eps = vec![LocalEndpoint::for_pod(&pod_named(&s, "x/a")), ep_ya];
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(peers.contains(&(cni_ip.to_string(), "y/a".into())), "{peers:?}");
    assert!(!peers.iter().any(|(_, c)| c == "y/stale"), "{peers:?}");

    // Its API address, if it reports another one, is not used: the endpoint's are.
    ya.ips = vec!["198.18.7.8".parse().unwrap()];
    s.upsert_pod(ya);
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(!peers.iter().any(|(a, _)| a == "198.18.7.8"), "{peers:?}");
}

#[test]
fn a_local_endpoint_of_an_unknown_pod_holds_its_address() {
    let mut s = with(FROM_Y);
    let ya = pod_named(&s, "y/a");
    // A pod not in the snapshot yet has y/a's address on this node: y/a's status is stale.
    let ghost = LocalEndpoint {
        interface: flock_cni::host_interface_name("cid-ghost", "eth0"),
        container_id: "cid-ghost".into(),
        pod: testkit::pod_ref("z/ghost"),
        pod_uid: Some("uid-ghost".into()),
        addrs: ya.ips.clone(),
    };
    s.upsert_pod(ya.clone());
    let eps = vec![LocalEndpoint::for_pod(&pod_named(&s, "x/a")), ghost];
    let peers = ingress_peers(&translate(&s, &eps, &Options::default()));
    assert!(!peers.iter().any(|(_, c)| c == "y/a"), "{peers:?}");
}

/// The `flock.dev/egress-domains` annotation is one more egress allow of its policy (the
/// NetworkPolicy tier, additive), by name; the trusted resolvers are the selected pods'.
#[test]
fn the_egress_domains_annotation_is_an_egress_allow_of_its_policy() {
    let s = with(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: by-name
  namespace: x
  annotations:
    flock.dev/egress-domains: '[{"name": "*.pypi.org", "ports": [{"port": 443}]}, {"name": "github.com"}]'
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}}]}]
"#,
    );
    let np = run(&s);
    assert_eq!(summary(&np, "x/a", E), "isolated: [x/b] *; [domains *.pypi.org] TCP:443; [domains github.com] *");
    let ep = np.endpoints.iter().find(|e| e.pod == testkit::pod_ref("x/a")).unwrap();
    let origins: Vec<String> = ep
        .egress
        .rules
        .iter()
        .filter(|r| matches!(r.peer, PeerMatch::Domains(_)))
        .flat_map(|r| &r.origins)
        .map(ToString::to_string)
        .collect();
    assert_eq!(origins, ["x/by-name flock.dev/egress-domains[0]", "x/by-name flock.dev/egress-domains[1]"]);
    assert!(np.problems.is_empty(), "{:?}", np.problems);
    // The resolvers: pods of the selected namespace with the labels.
    let options = Options {
        dns_resolvers: Some(ResolverPods { namespace: Some("y".into()), labels: [("pod".to_string(), "b".to_string())].into() }),
        ..Options::default()
    };
    let eps: Vec<LocalEndpoint> = s.pods().filter(|p| p.is_peer()).map(LocalEndpoint::for_pod).collect();
    let np = translate(&s, &eps, &options);
    let yb = s.pod_by_name(&testkit::pod_ref("y/b")).unwrap().ips.clone();
    assert_eq!(np.dns_resolvers, yb);
}

/// The exact reviewer-bypass example: `{"name": "api.example.com", "name": "*.example.com"}`
/// (serde_json's `Value` keeps the wildcard). The entry fails closed like any invalid one: it
/// allows nothing and is reported at the key; so does one with a duplicate inside `ports`.
/// The valid entry still applies.
#[test]
fn an_egress_domains_entry_with_a_duplicate_key_allows_nothing() {
    let s = with(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: by-name
  namespace: x
  annotations:
    flock.dev/egress-domains: '[{"name": "api.example.com", "name": "*.example.com"}, {"name": "github.com", "ports": [{"port": 22, "port": 443}]}, {"name": "pypi.org"}]'
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
"#,
    );
    let np = run(&s);
    assert_eq!(summary(&np, "x/a", E), "isolated: [domains pypi.org] *");
    let msgs: Vec<String> = np.problems.iter().map(ToString::to_string).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(
        msgs[0].starts_with("NetworkPolicy x/by-name: metadata.annotations[flock.dev/egress-domains][0].name: duplicate key"),
        "{msgs:?}"
    );
    assert!(
        msgs[1].starts_with("NetworkPolicy x/by-name: metadata.annotations[flock.dev/egress-domains][1].ports[0].port: duplicate key"),
        "{msgs:?}"
    );
    assert!(msgs.iter().all(|m| m.ends_with("this entry allows nothing")), "{msgs:?}");
}

/// A 10 MB label value (and other API strings of that size) in a policy is quoted clipped in
/// its problems: each stays short and still names the policy and the field.
#[test]
fn huge_api_strings_are_clipped_in_problems() {
    const MB10: usize = 10 << 20;
    let huge = "v".repeat(MB10);
    let marker = format!("…({MB10} bytes)");
    // Read from a manifest, as `flockctl` does: a selector value of 10 MB.
    let mut s = with(&format!(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: big, namespace: x}}
spec:
  podSelector: {{matchLabels: {{pod: {huge}}}}}
"
    ));
    // Every other quoted field, built directly.
    let sel = |key: &str, operator: &str, values: &[&str]| crate::model::LabelSelector {
        match_expressions: vec![crate::model::LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }],
        ..Default::default()
    };
    let peer = |p: crate::model::PolicyPeer| crate::model::PolicyRule { peers: vec![p], ports: vec![] };
    let port = |protocol: Option<&str>, name: &str| crate::model::PolicyRule {
        peers: vec![],
        ports: vec![crate::model::PolicyPort {
            protocol: protocol.map(str::to_string),
            port: Some(crate::model::PortRef::Name(name.into())),
            end_port: None,
        }],
    };
    s.upsert_policy(crate::model::NetworkPolicy {
        namespace: "x".into(),
        name: "many".into(),
        policy_types: vec!["Ingress".into(), huge.clone()],
        ingress: vec![
            peer(crate::model::PolicyPeer { namespace_selector: Some(sel("pod", "In", &[&huge])), ..Default::default() }),
            peer(crate::model::PolicyPeer { pod_selector: Some(sel(&huge, "Exists", &[])), ..Default::default() }),
            peer(crate::model::PolicyPeer { pod_selector: Some(sel("pod", &huge, &[])), ..Default::default() }),
            peer(crate::model::PolicyPeer {
                ip_block: Some(crate::model::IpBlock { cidr: huge.clone(), except: vec![] }),
                ..Default::default()
            }),
            port(Some(&huge), "http"),
            port(None, &huge),
        ],
        ..Default::default()
    });
    // A policy whose name is 10 MB: named, clipped.
    s.upsert_policy(crate::model::NetworkPolicy {
        namespace: "x".into(),
        name: huge.clone(),
        policy_types: vec!["Sideways".into()],
        ..Default::default()
    });
    // A ClusterNetworkPolicy: its tier, a rule's action and name, a domain name, a named
    // port and an unknown field.
    s.upsert_cluster_policy(
        crate::model::cnp::from_json(&serde_json::json!({
            "metadata": {"name": "cluster"},
            "spec": {
                "tier": huge, "priority": 1,
                "subject": {"namespaces": {}},
                "egress": [
                    {"name": huge, "action": huge, "to": [{"networks": ["10.0.0.0/8"]}]},
                    {"action": "Accept", "to": [{"domainNames": [huge]}]},
                    {"action": "Accept", "to": [{"namespaces": {}}], "protocols": [{"destinationNamedPort": huge}]},
                    {"action": "Deny", "to": [{huge.clone(): {}}]},
                ],
            },
        }))
        .unwrap(),
    );
    let np = run(&s);
    let msgs: Vec<String> = np.problems.iter().map(ToString::to_string).collect();
    assert_eq!(msgs.len(), 14, "{}", msgs.iter().map(|m| &m[..m.len().min(300)]).collect::<Vec<_>>().join("\n"));
    for m in &msgs {
        assert!(m.len() < 1024, "{} bytes: {}", m.len(), &m[..300]);
        assert!(m.contains(&marker), "{m}");
        assert!(
            m.starts_with("NetworkPolicy x/big: spec.podSelector.matchLabels[pod]: value \"vvv")
                || m.starts_with("NetworkPolicy x/many: spec.")
                || m.starts_with(&format!("NetworkPolicy x/{}{marker}: spec.policyTypes[0]", "v".repeat(crate::model::MAX_CLIP)))
                || m.starts_with("ClusterNetworkPolicy cluster: spec."),
            "{m}"
        );
    }
}

/// Every pod in every namespace is the Nodes' pod CIDRs as ranges (a node's own address in
/// one left out), and, one by one, the live pods outside them; a CIDR wider than /16 is no
/// range. A pod coming or going inside the ranges does not change the set.
#[test]
fn every_pod_is_the_pod_cidrs_and_the_pods_outside_them() {
    let mut s = with(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {}}]}]",
    );
    // node-2 holds an address inside its own pod CIDR; a third node claims a /8.
    let mut n2 = s.node("node-2").unwrap().clone();
    n2.addresses.push("198.18.2.250".parse().unwrap());
    s.upsert_node(n2);
    let mut n3 = s.node("node-1").unwrap().clone();
    n3.name = "node-3".into();
    n3.internal_ips = vec!["198.18.0.3".parse().unwrap()];
    n3.addresses = n3.internal_ips.clone();
    n3.pod_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
    s.upsert_node(n3);
    // y/c's address comes from another pool; z/c's is in the /8.
    let mut yc = pod_named(&s, "y/c");
    yc.ips = vec!["198.18.77.5".parse().unwrap()];
    s.upsert_pod(yc);
    let mut zc = pod_named(&s, "z/c");
    zc.ips = vec!["10.1.2.3".parse().unwrap()];
    s.upsert_pod(zc);
    let eps = vec![LocalEndpoint::for_pod(&pod_named(&s, "x/a"))];
    let np = translate(&s, &eps, &Options::default());
    let peers: Vec<String> = {
        let key = testkit::pod_ref("x/a");
        let ep = np.endpoints.iter().find(|e| e.pod == key).unwrap();
        let PeerMatch::Addresses(def) = &ep.ingress.rules[0].peer else { panic!("not a peer set") };
        np.peer_sets[def].v4.iter().map(|(n, c)| format!("{n} {c}")).collect()
    };
    assert_eq!(
        peers,
        [
            "10.1.2.3/32 z/c",
            "198.18.1.0/24 pod CIDR of node node-1",
            "198.18.2.0/25 pod CIDR of node node-2",
            "198.18.2.128/26 pod CIDR of node node-2",
            "198.18.2.192/27 pod CIDR of node node-2",
            "198.18.2.224/28 pod CIDR of node node-2",
            "198.18.2.240/29 pod CIDR of node node-2",
            "198.18.2.248/31 pod CIDR of node node-2",
            "198.18.2.251/32 pod CIDR of node node-2",
            "198.18.2.252/30 pod CIDR of node node-2",
            "198.18.77.5/32 y/c",
        ]
    );
    // Pods inside the ranges come and go: the same set.
    let mut gone = s.clone();
    gone.remove_pod(&pod_named(&s, "y/a").uid);
    let mut new = pod_named(&s, "y/b");
    (new.uid, new.name, new.ips) = ("uid-new".into(), "new".into(), vec!["198.18.1.200".parse().unwrap()]);
    gone.upsert_pod(new);
    assert_eq!(translate(&gone, &eps, &Options::default()).peer_sets, np.peer_sets);
}

#[test]
fn the_gaps_between_pod_ranges_cover_every_other_address() {
    let r = PodRanges::of(&testkit::base_cluster());
    let gaps: Vec<String> = r.gaps().iter().map(|(a, b)| format!("{a}-{b}")).collect();
    // The two /24s touch: no gap between them.
    assert_eq!(gaps, ["0.0.0.0-198.18.0.255", "198.18.3.0-255.255.255.255", "::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]);
    for ip in ["198.18.0.255", "198.18.3.0", "2001:db8::1"] {
        assert!(!r.contains(ip.parse().unwrap()), "{ip}");
    }
    for ip in ["198.18.1.0", "198.18.2.255"] {
        assert!(r.contains(ip.parse().unwrap()), "{ip}");
    }
}

/// A pod the cluster's source of pod identity does not show yet (an agent reading PodSlices
/// knows it from its own node's watch) is in no peer set, though it is a local endpoint;
/// its own chains follow its labels all the same.
#[test]
fn an_unpublished_pod_is_no_peer_but_keeps_its_own_chains() {
    let mut s = with(FROM_Y);
    s.upsert_policy(
        testkit::policies(
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: y}
spec: {podSelector: {matchLabels: {pod: a}}}",
        )
        .remove(0),
    );
    let published = run(&s);
    assert!(ingress_peers(&published).iter().any(|(_, c)| c == "y/a"), "{:?}", ingress_peers(&published));

    let mut ya = pod_named(&s, "y/a");
    ya.unpublished = true;
    s.upsert_pod(ya.clone());
    let eps: Vec<LocalEndpoint> = s.pods().filter(|p| p.is_peer() || p.unpublished).map(LocalEndpoint::for_pod).collect();
    let np = translate(&s, &eps, &Options::default());
    assert!(!ingress_peers(&np).iter().any(|(_, c)| c == "y/a"), "{:?}", ingress_peers(&np));
    // y/a's own ingress is isolated by policy y/deny, as when it was published.
    let own = np.endpoints.iter().find(|e| e.pod == testkit::pod_ref("y/a")).unwrap();
    assert!(!own.ingress.isolated_by.is_empty(), "y/a's own chains do not follow it");
    let before = published.endpoints.iter().find(|e| e.pod == testkit::pod_ref("y/a")).unwrap();
    assert_eq!(own.ingress.isolated_by, before.ingress.isolated_by);
}
