//! flock-controller without a cluster: the committed CRDs are the ones the Rust types
//! generate, the render goldens (one per profile feature, NetworkPolicy and
//! CiliumNetworkPolicy), byte stability, domain names (the exact annotation flock-agent reads,
//! Cilium's `toFQDNs`, the checks, the CRD's pattern against flock's parser), and the deploy
//! examples deserialize into the types.
//! `FLOCK_BLESS=1` rewrites the CRDs and the goldens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use flock::crd;

#[path = "common/controller.rs"]
mod common;
use common::root;

fn bless() -> bool {
    std::env::var_os("FLOCK_BLESS").is_some_and(|v| v == "1")
}

/// Compares `text` with the file, or rewrites it under `FLOCK_BLESS=1`.
fn golden(path: PathBuf, text: &str) {
    if bless() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (FLOCK_BLESS=1 writes it)", path.display()));
    assert!(want == text, "{} is stale (FLOCK_BLESS=1 rewrites it); got:\n{text}", path.display());
}

#[test]
fn crds_are_up_to_date() {
    let dir = root().join("deploy");
    for (path, text) in crd::crd_files().unwrap() {
        // The chart's copy too (Helm installs crds/ as they are; deploy/ is its render).
        let name = std::path::Path::new(&path).file_name().unwrap().to_owned();
        golden(dir.join("helm/flock/crds").join(name), &text);
        golden(dir.join(path), &text);
    }
}

// ---- render ---------------------------------------------------------------------------

use flock::controller::render::{self, ApiEndpoint, ClusterConfig, DnsConfig};
use flock::crd::{Run, RunProfile};

/// The test cluster (dual-stack): pods 198.18.0.0/20 and 2001:db8:1::/48, Services
/// 198.18.240.0/20 and 2001:db8:2::/112, the API server's Service at 198.18.240.1:443 and
/// endpoints 198.18.250.2:6443 and [2001:db8:250::2]:6443.
fn cluster() -> ClusterConfig {
    ClusterConfig {
        pod_cidrs: vec!["198.18.0.0/20".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()],
        service_cidrs: vec!["198.18.240.0/20".parse().unwrap(), "2001:db8:2::/112".parse().unwrap()],
        dns: DnsConfig::default(),
        api_server: [("198.18.240.1", 443), ("198.18.250.2", 6443), ("2001:db8:250::2", 6443)]
            .into_iter()
            .map(|(a, port)| ApiEndpoint { addr: a.parse().unwrap(), port })
            .collect(),
    }
}

fn run(yaml: &str) -> Run {
    let mut r: Run = serde_saphyr::from_str(yaml).unwrap();
    r.metadata.uid.get_or_insert_with(|| "0b5e8a4c-1d2e-4f60-9a7b-3c4d5e6f7a8b".into());
    r.metadata.namespace.get_or_insert_with(|| "agents".into());
    r
}

fn profile(yaml: &str) -> RunProfile {
    serde_saphyr::from_str(yaml).unwrap()
}

const RUN: &str = "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {name: job-7}\nspec: {profile: p}\n";

/// Profiles, one per feature, and the combination.
const PROFILES: &[(&str, &str)] = &[
    ("dns-only", "spec: {}"),
    ("no-egress", "spec: {dns: false}"),
    (
        "internet",
        "spec:\n  internet:\n    ports: [{port: 443}, {port: 80}, {port: 443, protocol: UDP}]\n    except: [198.51.100.0/24, 2001:db8:ffff::/48]",
    ),
    ("api-server", "spec: {dns: false, apiServer: true}"),
    (
        "services",
        "spec:\n  dns: false\n  services:\n  - {name: cache, podSelector: {matchLabels: {app: redis}}, ports: [{port: 6379}]}\n  - name: db\n    namespace: data\n    podSelector:\n      matchLabels: {app: postgres}\n      matchExpressions: [{key: role, operator: In, values: [primary]}]\n    ports: [{port: 5432}, {port: 9000, endPort: 9010}]",
    ),
    (
        "cidrs",
        "spec:\n  dns: false\n  cidrs:\n  - {cidr: 198.51.100.0/24, except: [198.51.100.128/25], ports: [{port: 22}]}\n  - {cidr: 2001:db8:aaaa::/48}",
    ),
    (
        "ingress",
        "spec:\n  ingress:\n  - {name: adapter, namespace: adapters, podSelector: {matchLabels: {app: adapter}}, ports: [{port: 8431}]}\n  - {name: same-namespace, podSelector: {matchLabels: {role: debugger}}}",
    ),
    ("ingress-closed", "spec: {ingress: []}"),
    (
        "domains",
        "spec:\n  domains:\n  - {name: GitHub.com., ports: [{port: 5010, protocol: UDP}, {port: 5000, endPort: 5010, protocol: UDP}, {port: 443}]}\n  - {name: '*.pypi.org', ports: [{port: 443}]}",
    ),
    (
        "full",
        "spec:\n  internet: {ports: [{port: 443}, {port: 80}]}\n  apiServer: true\n  services:\n  - {name: db, namespace: data, podSelector: {matchLabels: {app: postgres}}, ports: [{port: 5432}]}\n  cidrs:\n  - {cidr: 198.51.100.0/24, ports: [{port: 22}]}\n  ingress:\n  - {name: adapter, namespace: adapters, podSelector: {matchLabels: {app: adapter}}, ports: [{port: 8431}]}",
    ),
];

fn profile_named(name: &str, spec: &str) -> RunProfile {
    profile(&format!("apiVersion: flock.dev/v1alpha1\nkind: RunProfile\nmetadata: {{name: {name}}}\n{spec}\n"))
}

#[test]
fn render_goldens_for_each_profile_feature() {
    let dir = root().join("tests/golden/controller");
    for (name, spec) in PROFILES {
        let p = profile_named(name, spec);
        assert!(p.spec.problems().is_empty(), "{name}: {:?}", p.spec.problems());
        let np = render::render(&run(RUN), &p, &cluster()).unwrap();
        golden(dir.join(format!("{name}.yaml")), &crd::to_yaml(&np).unwrap());
        // flock-agent's translator takes it without a problem.
        let model = flock::model::convert::network_policy(&np).unwrap();
        let mut problems = Vec::new();
        flock::translate::compile::compile(&model, &mut problems);
        assert!(problems.is_empty(), "{name}: {problems:?}");
    }
    for name in ["full", "no-egress", "ingress-closed", "domains"] {
        let (_, spec) = PROFILES.iter().find(|(n, _)| *n == name).unwrap();
        let cnp = render::render_cilium(&run(RUN), &profile_named(name, spec), &cluster()).unwrap();
        golden(dir.join(format!("{name}.cilium.yaml")), &crd::to_yaml(&cnp).unwrap());
    }
    // A run that names its pods (all of them labelled flock.dev/run, as it must).
    let custom = run(
        "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {name: job-8}\nspec:\n  profile: p\n  podSelector:\n    matchLabels: {app: agent}\n    matchExpressions: [{key: tier, operator: Exists}, {key: flock.dev/run, operator: In, values: [job-8]}]\n",
    );
    let np = render::render(&custom, &profile_named("dns-only", "spec: {}"), &cluster()).unwrap();
    golden(dir.join("custom-selector.yaml"), &crd::to_yaml(&np).unwrap());
    // An expired run: the policy stays and allows nothing, both ways; its destinations are
    // none (what the audit trail records as removed).
    let (_, spec) = PROFILES.iter().find(|(n, _)| *n == "full").unwrap();
    let mut plan = render::plan(&run(RUN), &profile_named("full", spec), &cluster()).unwrap();
    assert!(plan.destinations().len() > 3, "{:?}", plan.destinations());
    plan.withdraw("2026-11-26T10:00:00Z");
    assert!(plan.destinations().is_empty());
    golden(dir.join("expired.yaml"), &crd::to_yaml(&render::network_policy(&plan)).unwrap());
    golden(dir.join("expired.cilium.yaml"), &crd::to_yaml(&render::cilium_network_policy(&plan)).unwrap());
    let model = flock::model::convert::network_policy(&render::network_policy(&plan)).unwrap();
    assert!(model.egress.is_empty() && model.ingress.is_empty() && model.policy_types == ["Ingress", "Egress"], "{model:?}");
}

#[test]
fn destinations_name_each_peer_and_its_ports() {
    let (_, spec) = PROFILES.iter().find(|(n, _)| *n == "full").unwrap();
    let plan = render::plan(&run(RUN), &profile_named("full", spec), &cluster()).unwrap();
    let d = plan.destinations();
    eprintln!("{d:#?}");
    assert!(d.iter().any(|l| l == "dns: pods kube-system/k8s-app=kube-dns on UDP/53,TCP/53"), "{d:#?}");
    assert!(d.iter().any(|l| l.starts_with("internet: 0.0.0.0/0 except 10.0.0.0/8,")), "{d:#?}");
    assert!(d.iter().any(|l| l == "api-server: 198.18.250.2/32 on TCP/6443"), "{d:#?}");
    let mut sorted = d.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(d, sorted);
}

#[test]
fn render_is_byte_stable() {
    let (_, spec) = PROFILES.iter().find(|(n, _)| *n == "full").unwrap();
    let p = profile_named("full", spec);
    let first = crd::to_yaml(&render::render(&run(RUN), &p, &cluster()).unwrap()).unwrap();
    for _ in 0..20 {
        // Equal input built in another order: the API server's addresses inserted in
        // reverse, the profile re-parsed.
        let mut c = cluster();
        let endpoints: Vec<ApiEndpoint> = c.api_server.iter().rev().copied().collect();
        c.api_server = endpoints.into_iter().collect();
        let again = crd::to_yaml(&render::render(&run(RUN), &profile_named("full", spec), &c).unwrap()).unwrap();
        assert_eq!(first, again);
        let cnp1 = serde_json::to_string(&render::render_cilium(&run(RUN), &p, &cluster()).unwrap()).unwrap();
        let cnp2 = serde_json::to_string(&render::render_cilium(&run(RUN), &p, &c).unwrap()).unwrap();
        assert_eq!(cnp1, cnp2);
    }
}

#[test]
fn render_is_dual_stack() {
    let (_, spec) = PROFILES.iter().find(|(n, _)| *n == "full").unwrap();
    let np = render::render(&run(RUN), &profile_named("full", spec), &cluster()).unwrap();
    let egress = np.spec.unwrap().egress.unwrap();
    // [0] DNS, [1] internet, [2] API server on 443, [3] on 6443, [4] db, [5] CIDR.
    assert_eq!(egress.len(), 6);
    let blocks: Vec<_> = egress[1].to.as_ref().unwrap().iter().map(|p| p.ip_block.clone().unwrap()).collect();
    assert_eq!(blocks[0].cidr, "0.0.0.0/0");
    assert_eq!(
        blocks[0].except.as_deref().unwrap(),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "198.18.0.0/20", "198.18.240.0/20"]
    );
    assert_eq!(blocks[1].cidr, "::/0");
    assert_eq!(
        blocks[1].except.as_deref().unwrap(),
        ["fc00::/7", "fe80::/10", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001:db8:1::/48", "2001:db8:2::/112"]
    );
    let api: Vec<Vec<String>> =
        egress[2..4].iter().map(|r| r.to.as_ref().unwrap().iter().map(|p| p.ip_block.clone().unwrap().cidr).collect()).collect();
    assert_eq!(api, [vec!["198.18.240.1/32".to_string()], vec!["198.18.250.2/32".to_string(), "2001:db8:250::2/128".to_string()]]);
    let ports: Vec<i32> = egress[2..4]
        .iter()
        .map(|r| match r.ports.as_ref().unwrap()[0].port {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p)) => p,
            _ => 0,
        })
        .collect();
    assert_eq!(ports, [443, 6443]);
}

#[test]
fn render_refuses_invalid_input_naming_it() {
    let bad = profile_named("bad", "spec:\n  cidrs: [{cidr: 198.51.100.1/24}]");
    let e = render::render(&run(RUN), &bad, &cluster()).unwrap_err();
    assert!(e.to_string().contains("RunProfile bad is invalid: spec.cidrs[0].cidr"), "{e}");
    let r = run("apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {name: job-9}\nspec: {profile: p, podSelector: {}}\n");
    let e = render::render(&r, &profile_named("p", "spec: {}"), &cluster()).unwrap_err();
    assert!(e.to_string().contains("run agents/job-9 is invalid: spec.podSelector"), "{e}");
    // A custom selector must require flock.dev/run: the pods it selects otherwise would be
    // open until the policy exists (flock-agent isolates only labelled pods before that).
    for selector in ["{matchLabels: {app: agent}}", "{matchExpressions: [{key: flock.dev/run, operator: NotIn, values: [x]}]}"] {
        let r = run(&format!(
            "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {{name: job-10}}\nspec: {{profile: p, podSelector: {selector}}}\n"
        ));
        let e = render::render(&r, &profile_named("p", "spec: {}"), &cluster()).unwrap_err();
        assert!(e.to_string().contains("spec.podSelector: must require the flock.dev/run label"), "{e}");
    }
    for selector in
        ["{matchLabels: {flock.dev/run: job-10, app: agent}}", "{matchExpressions: [{key: flock.dev/run, operator: In, values: [job-10]}]}"]
    {
        let r = run(&format!(
            "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {{name: job-10}}\nspec: {{profile: p, podSelector: {selector}}}\n"
        ));
        assert!(render::render(&r, &profile_named("p", "spec: {}"), &cluster()).is_ok(), "{selector}");
    }
    // The label, but not pinned to this run: other runs' pods (the attack: a profile that
    // adds to what they may reach).
    for selector in [
        "{matchExpressions: [{key: flock.dev/run, operator: In, values: [a, b]}]}",
        "{matchExpressions: [{key: flock.dev/run, operator: Exists}]}",
        "{matchLabels: {flock.dev/run: job-11}}",
    ] {
        let r = run(&format!(
            "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {{name: job-10}}\nspec: {{profile: p, podSelector: {selector}}}\n"
        ));
        let e = render::render(&r, &profile_named("p", "spec: {}"), &cluster()).unwrap_err();
        assert!(e.to_string().contains("spec.podSelector: must select only this run's pods: flock.dev/run: job-10"), "{selector}: {e}");
    }
}

// ---- domain names ---------------------------------------------------------------------

use flock::controller::reconcile;
use flock::model::EGRESS_DOMAINS_ANNOTATION;

fn domains_profile() -> RunProfile {
    let (_, spec) = PROFILES.iter().find(|(n, _)| *n == "domains").unwrap();
    profile_named("domains", spec)
}

fn annotations(np: &k8s_openapi::api::networking::v1::NetworkPolicy) -> std::collections::BTreeMap<String, String> {
    np.metadata.annotations.clone().unwrap_or_default()
}

#[test]
fn domains_are_the_annotation_flock_agent_reads_exactly() {
    let np = render::render(&run(RUN), &domains_profile(), &cluster()).unwrap();
    // Sorted by name ('*' sorts before letters), names lowercase without the trailing dot,
    // ports sorted (protocol, port, endPort), endPort only for a range.
    assert_eq!(
        annotations(&np)[EGRESS_DOMAINS_ANNOTATION],
        r#"[{"name":"*.pypi.org","ports":[{"protocol":"TCP","port":443}]},{"name":"github.com","ports":[{"protocol":"TCP","port":443},{"protocol":"UDP","port":5000,"endPort":5010},{"protocol":"UDP","port":5010}]}]"#
    );
    // Names are no rule of the NetworkPolicy: DNS is its only egress rule.
    assert_eq!(np.spec.as_ref().unwrap().egress.as_ref().unwrap().len(), 1);
    let plan = render::plan(&run(RUN), &domains_profile(), &cluster()).unwrap();
    let d = plan.destinations();
    assert!(d.contains(&"domain: github.com on TCP/443,UDP/5000-5010,UDP/5010".to_string()), "{d:#?}");
    assert!(d.contains(&"domain: *.pypi.org on TCP/443".to_string()), "{d:#?}");

    // No domains, no annotation.
    for name in ["dns-only", "full"] {
        let (_, spec) = PROFILES.iter().find(|(n, _)| *n == name).unwrap();
        let np = render::render(&run(RUN), &profile_named(name, spec), &cluster()).unwrap();
        assert!(!annotations(&np).contains_key(EGRESS_DOMAINS_ANNOTATION), "{name}");
    }
    // Expired: the names go with the rest.
    let mut plan = render::plan(&run(RUN), &domains_profile(), &cluster()).unwrap();
    plan.withdraw("2026-11-26T10:00:00Z");
    assert!(plan.destinations().is_empty());
    assert!(!annotations(&render::network_policy(&plan)).contains_key(EGRESS_DOMAINS_ANNOTATION));
    let cnp = render::cilium_network_policy(&plan);
    assert_eq!(cnp["spec"]["egress"], serde_json::json!([{}]), "{cnp:#}");
}

#[test]
fn cilium_gets_to_fqdns_rules_and_sees_the_dns_answers() {
    let cnp = render::render_cilium(&run(RUN), &domains_profile(), &cluster()).unwrap();
    let egress = cnp["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3, "{cnp:#}");
    // DNS, through Cilium's DNS proxy for every name, so toFQDNs learns the answers.
    assert_eq!(egress[0]["toPorts"][0]["rules"], serde_json::json!({"dns": [{"matchPattern": "*"}]}), "{cnp:#}");
    assert_eq!(egress[0]["toEndpoints"][0]["matchLabels"]["k8s-app"], "kube-dns");
    // `*.` over one or more labels is Cilium's `**.`; exact names are matchName.
    assert_eq!(egress[1]["toFQDNs"], serde_json::json!([{"matchPattern": "**.pypi.org"}]));
    assert_eq!(egress[1]["toPorts"], serde_json::json!([{"ports": [{"port": "443", "protocol": "TCP"}]}]));
    assert_eq!(egress[2]["toFQDNs"], serde_json::json!([{"matchName": "github.com"}]));
    assert_eq!(egress[2]["toPorts"][0]["ports"][1], serde_json::json!({"port": "5000", "endPort": 5010, "protocol": "UDP"}));
    // The annotation is flock-agent's, not Cilium's.
    assert!(cnp["metadata"]["annotations"].get(EGRESS_DOMAINS_ANNOTATION).is_none(), "{cnp:#}");
    assert_eq!(cnp["metadata"]["annotations"]["flock.dev/profile"], "domains");
    // Without names the DNS rule stays plain L4 (no proxy).
    let plain = render::render_cilium(&run(RUN), &profile_named("p", "spec: {}"), &cluster()).unwrap();
    assert!(plain["spec"]["egress"][0]["toPorts"][0].get("rules").is_none(), "{plain:#}");
}

#[test]
fn invalid_names_and_names_without_dns_are_profile_invalid() {
    for (name, why) in [
        ("a.*.example.com", "'*' may only be the first label"),
        ("com", "at least two labels"),
        ("exa mple.com", "a character other than"),
        ("-a.example.com", "starts or ends with '-'"),
        ("", "a domain name is required"),
    ] {
        let bad = profile_named("bad", &format!("spec:\n  domains:\n  - {{name: '{name}', ports: [{{port: 443}}]}}"));
        let e = render::render(&run(RUN), &bad, &cluster()).unwrap_err();
        let (reason, message) = reconcile::user_error(&e);
        assert_eq!(reason, "ProfileInvalid", "{name}");
        assert!(message.starts_with("RunProfile bad is invalid: spec.domains[0].name: "), "{message}");
        assert!(message.contains(&format!("{name:?} is not a domain name")) && message.contains(why), "{message}");
    }
    let no_dns = profile_named("no-dns", "spec:\n  dns: false\n  domains:\n  - {name: github.com, ports: [{port: 443}]}");
    let e = render::render(&run(RUN), &no_dns, &cluster()).unwrap_err();
    let (reason, message) = reconcile::user_error(&e);
    assert_eq!(reason, "ProfileInvalid");
    assert!(message.contains("spec.domains: domains need dns"), "{message}");
    assert!(render::render_cilium(&run(RUN), &no_dns, &cluster()).is_err());
    // Ports are required: a name is never "every port".
    let no_ports = profile_named("no-ports", "spec:\n  domains:\n  - {name: github.com, ports: []}");
    let e = render::render(&run(RUN), &no_ports, &cluster()).unwrap_err();
    assert!(e.to_string().contains("spec.domains[0].ports: at least one port is required"), "{e}");
}

/// The CRD's `pattern` for names (what the API server checks) against flock's parser (what
/// the controller checks): they agree on these, and whatever the pattern lets through that
/// the parser refuses (a name past 253 characters) is still `ProfileInvalid`.
#[test]
fn the_crd_name_pattern_agrees_with_the_parser() {
    let profile = &crd::crd_files().unwrap()[0].1;
    let crd: serde_json::Value = serde_saphyr::from_str(profile).unwrap();
    let name = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["domains"]["items"]["properties"]
        ["name"];
    let pattern = regex::Regex::new(name["pattern"].as_str().unwrap()).unwrap();
    assert_eq!(name["maxLength"], 256);
    let long_label = "a".repeat(63);
    let too_long_label = "a".repeat(64);
    let cases = [
        "github.com",
        "GitHub.COM.",
        "*.pypi.org",
        "*.pypi.org.",
        "x_y.example.com",
        "_srv.example.com",
        "a-b.example.com",
        "1.example.com",
        &format!("{long_label}.com"),
        &format!("{too_long_label}.com"),
        "com",
        "*.com",
        "*",
        "*.",
        "",
        ".",
        "a..com",
        "a.*.com",
        "**.example.com",
        "*example.com",
        "-a.com",
        "a-.com",
        "a b.com",
        "exämple.com",
        "example.com..",
        ".example.com",
    ];
    for case in cases {
        let schema = pattern.is_match(case);
        let parser = flock::dns::DomainPattern::parse(case).is_ok();
        assert_eq!(schema, parser, "{case:?}: schema {schema}, parser {parser}");
    }
    // The CEL rules of the list and the profile.
    assert!(profile.contains("domain names must be unique") && profile.contains("domains need dns"), "{profile}");
}

// ---- deploy examples ------------------------------------------------------------------

/// Whether every field of `original` is in `parsed` with the same value (defaults may add
/// fields; an unknown field is dropped by deserialization and so shows up here).
fn subset(original: &serde_json::Value, parsed: &serde_json::Value, at: &str) -> Result<(), String> {
    use serde_json::Value;
    match (original, parsed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let w = b.get(k).ok_or(format!("{at}.{k}: unknown field"))?;
                subset(v, w, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().try_for_each(|(i, (v, w))| subset(v, w, &format!("{at}[{i}]")))
        }
        _ if original == parsed => Ok(()),
        _ => Err(format!("{at}: {original} read as {parsed}")),
    }
}

#[test]
fn deploy_examples_are_valid_custom_resources() {
    let dir = root().join("deploy/controller");
    let mut profiles = Vec::new();
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.contains("-example") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for value in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
            match value["kind"].as_str() {
                Some("RunProfile") => {
                    let p: RunProfile = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
                    subset(&value, &serde_json::to_value(&p).unwrap(), &name).unwrap();
                    assert!(p.spec.problems().is_empty(), "{name}: {:?}", p.spec.problems());
                    profiles.push(p);
                }
                Some("Run") => {
                    let r: Run = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
                    subset(&value, &serde_json::to_value(&r).unwrap(), &name).unwrap();
                    assert!(r.spec.problems().is_empty(), "{name}: {:?}", r.spec.problems());
                    runs.push(r);
                }
                other => panic!("{name}: unexpected kind {other:?}"),
            }
        }
    }
    assert!(!profiles.is_empty() && !runs.is_empty());
    // The example run uses the example profile, and renders.
    for mut r in runs {
        let p =
            profiles.iter().find(|p| p.metadata.name.as_deref() == Some(r.spec.profile.as_str())).expect("the run's profile is an example");
        r.metadata.uid = Some("example".into());
        render::render(&r, p, &cluster()).unwrap();
    }
    // The checker itself sees unknown fields.
    let bad = serde_json::json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": "x"}, "spec": {"profile": "p", "podSelectr": {}}});
    let r: Run = serde_json::from_value(bad.clone()).unwrap();
    assert!(subset(&bad, &serde_json::to_value(&r).unwrap(), "bad").is_err());
}

/// The RunProfile path of the domain conformance cases
/// (`tests/conformance{,-v6}/308-dns-runprofile-egress-domains`): the NetworkPolicy they apply
/// is, object for object, what flock-controller writes for Run x/job-1 and RunProfile
/// pkg-mirror, so that the kernel runs of those cases enforce the controller's output.
#[test]
fn the_runprofile_domain_cases_apply_what_the_controller_writes() {
    let run = run("apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {name: job-1, namespace: x}\nspec: {profile: pkg-mirror}\n");
    let profile = profile_named("pkg-mirror", "spec:\n  domains:\n  - {name: '*.pkg.example.test', ports: [{port: 80}]}");
    let text = crd::to_yaml(&render::render(&run, &profile, &cluster()).unwrap()).unwrap();
    let written = flock::testkit::parse_manifests(&text).objects;
    assert_eq!(written.len(), 1, "{text}");
    for dir in ["conformance", "conformance-v6"] {
        let case = flock::source::files::load_case(&root().join("tests").join(dir).join("308-dns-runprofile-egress-domains")).unwrap();
        let applied: Vec<_> =
            case.steps[0].apply.iter().filter(|o| matches!(o, flock::model::manifest::Object::NetworkPolicy(_))).cloned().collect();
        assert_eq!(applied, written, "{dir}: the case's NetworkPolicy is not the controller's:\n{text}");
    }
}
