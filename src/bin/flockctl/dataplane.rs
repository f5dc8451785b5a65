//! `flockctl bench --dataplane`: what flock's ruleset costs the data path, as new TCP
//! connections per second through a node with the rendered table, next to the same node with
//! the table's skeleton and no policy (conntrack alone).
//!
//! This module owns the whole measurement: the scenarios' snapshots (built here, or taken from
//! [`flock::synth`]), the topology per scenario in throwaway network namespaces (`flkt-<pid>-dp…`,
//! removed on exit, on error and on SIGINT/SIGTERM/SIGHUP; a killed run's are swept by the
//! next one) and the JSON report; the load generator it shares with [`crate::overlay`] lives in
//! [`crate::twins`].
//!
//! Scenario `pod_to_node` measures the other path flock polices: a pod on the node opening
//! connections to the node's own address (hook `input`, the pod's egress chains). Its twins
//! are a client pod's namespace wired to the node like a pod (`eth0` to the host side named
//! as the maps name it) and the node's namespace, where the server listens on the node's
//! address; the pod's egress is what the policies restrict, and a port they do not admit is
//! the denied flow checked at setup.
//!
//! Topology, twice per scenario (one node with flock's table, one with the conntrack-only
//! table: the same snapshot without policies, where the server's map entry is `accept`): a
//! client namespace (`eth0`, the client's address) — routed by the node over its uplink
//! `uplink0` (not a pod interface: the client is a pod of another node or an outside
//! address) — the node namespace (forwarding, the table applied with real nft through the
//! [`Applier`]) and the server pod's namespace (`eth0`, the address the snapshot gives the
//! pod), whose host side carries the name the ruleset's maps use for the pod. Routes are /32
//! (/128) and neighbours static, so no ARP or ND runs during a round and only 198.18.0.0/15
//! or 2001:db8::/32 addresses are ever assigned or used.
//!
//! Each round gives every scenario `--dataplane-seconds` of load on each twin, in slices that
//! alternate ABBA…; a round's ratio is flock / conntrack-only of that round. Twins, not one
//! node whose table is swapped between measurements: a swap of the large tables takes
//! seconds and leaves the kernel freeing thousands of sets while the next measurement runs,
//! and twins let the tables take turns in short slices, which keeps the noise of a shared
//! two-core machine out of the ratio.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use serde_json::{Value, json};

use flock::apply::Applier;
use flock::apply::kernel::NftCli;
use flock::model::convert::NAMESPACE_NAME_LABEL;
use flock::model::{
    ContainerPort, IpBlock, LabelSelector, Labels, LocalEndpoint, Namespace, NetworkPolicy, Node, Pod, PolicyPeer, PolicyPort, PolicyRule,
    PortRef, Protocol, Snapshot,
};
use flock::netns::Netns;
use flock::nft::NftRuleset;
use flock::nft::trace::{self, Ct, L4, Packet, Tracer, Verdict};
use flock::render::{self, Object, RenderOptions, Ruleset};
use flock::sim::fabric::run as sh;
use flock::synth::{self, Params, Rng};
use flock::translate::{self, Options};
use flock_cni::testing::{NetnsGuard, PREFIX};

use crate::twins::{
    CONNECT_TIMEOUT, CT_TIMEOUTS, Load, NS, PORT, REQUEST, SLICE, Server, WARM_UP, load, median, netns, path, pod, probe, round3,
    server_policy, spread, sysctl,
};

#[derive(Args)]
pub struct DataplaneArgs {
    /// --dataplane: NetworkPolicies selecting the server in the ip_blocks and pod_selectors
    /// scenarios.
    #[arg(long, default_value_t = 1_000)]
    dataplane_policies: usize,
    /// --dataplane: peers per policy (ipBlocks in ip_blocks, pod selectors in pod_selectors).
    #[arg(long, default_value_t = 10)]
    dataplane_blocks: usize,
    /// --dataplane: seconds of load per round on each table (in slices of about 0.25 s).
    #[arg(long, default_value_t = 2.0)]
    dataplane_seconds: f64,
    /// --dataplane: rounds (each measures every scenario with flock's ruleset and with
    /// conntrack alone).
    #[arg(long, default_value_t = 5)]
    dataplane_rounds: usize,
    /// --dataplane: client threads (each opens one connection at a time).
    #[arg(long, default_value_t = 2)]
    dataplane_clients: usize,
    /// --dataplane: server threads accepting connections.
    #[arg(long, default_value_t = 1)]
    dataplane_servers: usize,
    /// --dataplane: flock's table with the rule that stops revoked connections (the
    /// agent's default); false measures the table without it (the conntrack-only table
    /// never has it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dataplane_revoke: bool,
    /// --dataplane: also pod to pod across two nodes, host-gw next to VXLAN (new
    /// connections per second and one stream's throughput).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dataplane_overlay: bool,
}

impl DataplaneArgs {
    /// How flock's table is rendered.
    fn flock_options(&self) -> RenderOptions {
        RenderOptions { revoked: self.dataplane_revoke.then_some(render::REVOKED_MARK), ..RenderOptions::DEFAULT }
    }
}

/// The conntrack-only table: flock's skeleton without policy or revocation.
const CONNTRACK_ONLY: RenderOptions = RenderOptions { revoked: None, ..RenderOptions::DEFAULT };

/// The node's interface towards the client (not `flk*`: the node's uplink).
const UPLINK: &str = "uplink0";
/// Locally administered MAC addresses of the four veth ends (static neighbours).
const MAC_UPLINK: &str = "02:66:6c:6b:00:01";
const MAC_CLIENT: &str = "02:66:6c:6b:00:02";
const MAC_POD_HOST: &str = "02:66:6c:6b:00:03";
const MAC_SERVER: &str = "02:66:6c:6b:00:04";
/// How long a connection the policy denies is given before it counts as dropped.
const DENIED_TIMEOUT: Duration = Duration::from_millis(500);

/// Which path of the node a scenario's connections take.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// From the uplink to a pod of the node (hook `forward`, the pod's ingress chains).
    Forward,
    /// From a pod of the node to the node's own address (hook `input`, the pod's egress
    /// chains).
    ToNode,
}

/// One scenario: a server pod on the node and a client the policies allow (or, for
/// [`Route::ToNode`], a client pod on the node and the node's address), and the two tables.
struct Scenario {
    name: &'static str,
    what: String,
    route: Route,
    /// The pod of the node whose chains the connections meet: the server, or the client
    /// pod (to the node).
    local: LocalEndpoint,
    server_addr: IpAddr,
    port: u16,
    client: IpAddr,
    /// A source the flock table drops (checked once at setup), if one was found.
    denied: Option<IpAddr>,
    /// A port of the server the flock table drops (checked once at setup).
    denied_port: Option<u16>,
    flock: Ruleset,
    conntrack_only: Ruleset,
}

pub fn run(params: &Params, args: &DataplaneArgs) -> anyhow::Result<Value> {
    let out = measure(params, args);
    // A signal's handler is removing the namespaces under the measurement, which fails for
    // it: the handler's exit (128 + the signal) is the outcome, not that failure.
    if out.is_err() && INTERRUPTED.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    out
}

/// Set by the signal handler ([`remove_on_signal`]) before it removes anything.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn measure(params: &Params, args: &DataplaneArgs) -> anyhow::Result<Value> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(json!({"dataplane": {"skipped": "not root"}}));
    }
    if args.dataplane_rounds == 0 || args.dataplane_clients == 0 || args.dataplane_servers == 0 {
        bail!("--dataplane-rounds, --dataplane-clients and --dataplane-servers must be at least 1");
    }
    if !(args.dataplane_seconds > 0.0 && args.dataplane_seconds.is_finite()) {
        bail!("--dataplane-seconds must be a positive number");
    }
    if args.dataplane_policies == 0 || args.dataplane_blocks == 0 {
        bail!("--dataplane-policies and --dataplane-blocks must be at least 1");
    }
    // Namespaces of killed earlier runs (whose process is gone), then ours on a signal.
    flock_cni::testing::sweep();
    remove_on_signal().context("installing the signal handlers")?;

    let started = Instant::now();
    let scenarios =
        [ip_blocks(args)?, pod_selectors(args)?, synthetic_busiest(params, args.flock_options())?, pod_to_node(args)?, admin_tiers(args)?];
    eprintln!("dataplane: scenarios built in {:.2}s", started.elapsed().as_secs_f64());
    let mut topologies = Vec::new();
    for s in &scenarios {
        eprintln!("dataplane: {}: wiring and checking ({} rules in the table)", s.name, s.flock.stats().rules);
        topologies.push(Topology::new(s, args).with_context(|| format!("setting up scenario {}", s.name))?);
    }

    let seconds = Duration::from_secs_f64(args.dataplane_seconds);
    let mut results: Vec<[Vec<Load>; 2]> = scenarios.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for round in 0..args.dataplane_rounds {
        for ((s, topo), result) in scenarios.iter().zip(&mut topologies).zip(&mut results) {
            let [flock, ct] =
                topo.round(round, seconds, args.dataplane_clients).with_context(|| format!("scenario {}, round {}", s.name, round + 1))?;
            eprintln!(
                "dataplane: round {}/{} {}: flock {:.0}/s, conntrack only {:.0}/s ({:.3})",
                round + 1,
                args.dataplane_rounds,
                s.name,
                flock.rate(),
                ct.rate(),
                flock.rate() / ct.rate().max(f64::MIN_POSITIVE)
            );
            result[0].push(flock);
            result[1].push(ct);
        }
    }

    let mut out = serde_json::Map::new();
    let mut worst: Option<(&str, f64)> = None;
    for ((s, topo), [flock, ct]) in scenarios.iter().zip(&topologies).zip(&results) {
        let ratios: Vec<f64> = flock.iter().zip(ct).map(|(f, c)| f.rate() / c.rate().max(f64::MIN_POSITIVE)).collect();
        let median_ratio = median(&ratios);
        if worst.is_none_or(|(_, r)| median_ratio < r) {
            worst = Some((s.name, median_ratio));
        }
        out.insert(s.name.into(), report(s, topo, flock, ct, &ratios));
    }
    let Some((worst, ratio)) = worst else { bail!("no scenario") };
    // The topologies go first: the overlay's twins are measured alone.
    drop(topologies);
    let overlay = if args.dataplane_overlay {
        eprintln!("dataplane: overlay: wiring host-gw and VXLAN twins");
        crate::overlay::measure(args.dataplane_rounds, seconds, args.dataplane_clients, args.dataplane_servers, &args.flock_options())
            .context("the overlay")?
    } else {
        Value::Null
    };
    let ct_timeouts: serde_json::Map<String, Value> = CT_TIMEOUTS.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    Ok(json!({"dataplane": {
        "ratio": round3(ratio),
        "worst": worst,
        "rounds": args.dataplane_rounds,
        "seconds_per_round": args.dataplane_seconds,
        "revoke_rule": args.dataplane_revoke,
        "machine": {
            "cpus": std::thread::available_parallelism().map_or(0, usize::from),
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default(),
        },
        "load": {
            "client_threads": args.dataplane_clients,
            "server_threads": args.dataplane_servers,
            "connection": format!(
                "connect, {} bytes each way, then the client resets it (SO_LINGER 0: no TIME_WAIT, so no port runs out); one connection at a time per client thread",
                REQUEST.len()
            ),
            "conn_per_s": format!(
                "per round, connections completed / seconds of load; the two tables take turns in slices of about {} s (ABBA…) and a round's ratio is flock / conntrack-only of that round",
                SLICE.as_secs_f64()
            ),
        },
        "topology": format!(
            "per scenario, twice (flock's table, conntrack-only table): client netns (eth0) <-> {UPLINK} [node netns: forwarding, table inet flock] <pod interface> <-> server pod netns (eth0); pod_to_node: client pod netns (eth0) <-> <pod interface> [node netns: table inet flock, the server on the node's address]; static /32 (/128) routes and neighbours"
        ),
        "sysctls": {
            "client": {"net.ipv4.ip_local_port_range": "1024 65535", "net.ipv4.tcp_tw_reuse": "1"},
            "node": {"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1", "conntrack": ct_timeouts},
            "server": {"net.core.somaxconn": "4096", "listen_backlog": 4096},
        },
        "scenarios": out,
        "overlay": overlay,
    }}))
}

fn report(s: &Scenario, topo: &Topology, flock: &[Load], ct: &[Load], ratios: &[f64]) -> Value {
    let rates = |v: &[Load]| spread(&v.iter().map(Load::rate).collect::<Vec<_>>());
    let slowest = |v: &[Load]| round3(v.iter().map(|l| l.slowest).max().unwrap_or_default().as_secs_f64() * 1e3);
    let st = s.flock.stats();
    let ct_st = s.conntrack_only.stats();
    let chains = &topo.server_chains;
    let (server, client) = match s.route {
        Route::Forward => (
            json!({"pod": s.local.pod.to_string(), "interface": s.local.interface, "address": s.server_addr.to_string(), "port": s.port}),
            json!({"address": s.client.to_string()}),
        ),
        Route::ToNode => (
            json!({"node_address": s.server_addr.to_string(), "port": s.port, "denied_port_dropped": s.denied_port}),
            json!({"pod": s.local.pod.to_string(), "interface": s.local.interface, "address": s.client.to_string()}),
        ),
    };
    let mut client = client;
    client["accepted_by"] = json!(topo.accepted_by);
    client["rule_position"] = json!(topo.rule_position);
    client["rules_evaluated_by_first_packet"] = json!(topo.rules_evaluated);
    client["denied_source_dropped"] = json!(s.denied.map(|d| d.to_string()));
    json!({
        "what": s.what,
        "path": match s.route { Route::Forward => "forward (uplink to a pod of the node)", Route::ToNode => "input (a pod of the node to the node's own address)" },
        "server": server,
        "client": client,
        "flock_conn_per_s": rates(flock),
        "conntrack_only_conn_per_s": rates(ct),
        "ratio": spread(ratios),
        "slowest_connection_ms": {"flock": slowest(flock), "conntrack_only": slowest(ct)},
        "connections": {
            "flock": flock.iter().map(|l| l.completed).sum::<u64>(),
            "conntrack_only": ct.iter().map(|l| l.completed).sum::<u64>(),
        },
        "conntrack_entries_peak": {"flock": topo.sides[0].conntrack_peak, "conntrack_only": topo.sides[1].conntrack_peak},
        "conntrack_max": topo.conntrack_max,
        "ruleset": {
            "chains": st.chains,
            "rules": st.rules,
            "sets": st.sets,
            "elements": st.elements,
            "rules_in_pod_chains": chains.rules,
            "pod_chains": chains.chains.len(),
            "sets_in_pod_chains": chains.sets.len(),
            "elements_in_pod_sets": chains.elements,
            "conntrack_only_rules": ct_st.rules,
            "conntrack_only_elements": ct_st.elements,
        },
    })
}

// ---------------------------------------------------------------------------------------
// Scenarios.

fn addr4(base: Ipv4Addr, offset: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(base) + offset))
}

/// The server pod of the hand-built scenarios: `bench/server` on node-0, 198.18.0.10.
fn server_pod() -> Pod {
    let mut labels = Labels::new();
    labels.insert("app", "server");
    pod(
        "server",
        labels,
        "node-0",
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10)),
        vec![ContainerPort { name: Some("http".into()), port: PORT, protocol: Protocol::Tcp }],
    )
}

/// The skeleton of the hand-built scenarios: namespace `bench`, nodes node-0 (the server's,
/// 198.18.0.0/24) and node-1 (everyone else's, 198.19.0.0/16), the server pod.
fn base_snapshot() -> Snapshot {
    let mut s = Snapshot::new();
    let mut labels = Labels::new();
    labels.insert(NAMESPACE_NAME_LABEL, NS);
    s.upsert_namespace(Namespace { name: NS.into(), labels, ..Namespace::default() });
    for (i, cidr, ip) in [(0, "198.18.0.0/24", Ipv4Addr::new(198, 18, 0, 1)), (1, "198.19.0.0/16", Ipv4Addr::new(198, 19, 0, 1))] {
        let mut labels = Labels::new();
        labels.insert("kubernetes.io/hostname", format!("node-{i}"));
        let ip = IpAddr::V4(ip);
        s.upsert_node(Node {
            name: format!("node-{i}"),
            pod_cidrs: cidr.parse().into_iter().collect(),
            internal_ips: vec![ip],
            addresses: vec![ip],
            labels,
        });
    }
    s.upsert_pod(server_pod());
    s
}

/// A source no hand-built policy allows.
const DENIED_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 254);

/// `n` /32 ipBlock peers at random addresses of 198.18.0.0/15 other than `reserved`; the
/// last one is `last` when given.
fn random_blocks(rng: &mut Rng, n: usize, last: Option<IpAddr>, reserved: &[IpAddr]) -> Vec<PolicyPeer> {
    (0..n)
        .map(|j| {
            let ip = match last {
                Some(ip) if j + 1 == n => ip,
                _ => loop {
                    let ip = addr4(Ipv4Addr::new(198, 18, 0, 0), rng.below(1 << 17) as u32);
                    if !reserved.contains(&ip) {
                        break ip;
                    }
                },
            };
            PolicyPeer { ip_block: Some(IpBlock { cidr: format!("{ip}/32"), except: vec![] }), ..Default::default() }
        })
        .collect()
}

/// (a) `policies` policies × `blocks` /32 ipBlocks at random addresses; the client's address
/// is the last block of the last policy (in name order, which is the rules' order).
fn ip_blocks(args: &DataplaneArgs) -> anyhow::Result<Scenario> {
    let (p, b) = (args.dataplane_policies, args.dataplane_blocks);
    let mut s = base_snapshot();
    let client = IpAddr::V4(Ipv4Addr::new(198, 19, 255, 1));
    let server = server_pod();
    let reserved = [client, server.ips[0], IpAddr::V4(DENIED_V4)];
    let mut rng = Rng::new(0x1b10c5);
    for i in 0..p {
        let peers = random_blocks(&mut rng, b, (i + 1 == p).then_some(client), &reserved);
        s.upsert_policy(server_policy(format!("ip-blocks-{i:05}"), peers));
    }
    let what = format!(
        "{p} NetworkPolicies in namespace {NS} select the server pod, each allowing TCP {PORT} from one ingress rule of {b} /32 ipBlocks at random addresses of 198.18.0.0/15; the client's address is the last ipBlock of the last policy"
    );
    hand_built("ip_blocks", what, s, client, args.flock_options())
}

/// (b) `policies` policies × `blocks` pod-selector peers, each selecting one pod of the
/// namespace on node-1; the client is the pod of the last policy's last peer.
fn pod_selectors(args: &DataplaneArgs) -> anyhow::Result<Scenario> {
    let (p, b) = (args.dataplane_policies, args.dataplane_blocks);
    // Peer pods from 198.18.1.0 up, below the denied source at the end of 198.19.0.0/16.
    let peer_base = Ipv4Addr::new(198, 18, 1, 0);
    let room = u32::from(DENIED_V4) - u32::from(peer_base);
    let Some(count) = p.checked_mul(b).filter(|n| *n < room as usize) else {
        bail!("pod_selectors: {p} policies × {b} peer pods do not fit in 198.18.1.0-198.19.255.253");
    };
    let mut s = base_snapshot();
    let mut client = None;
    for i in 0..p {
        let mut peers = Vec::with_capacity(b);
        for j in 0..b {
            let role = format!("peer-{i}-{j}");
            let k = i * b + j;
            let ip = addr4(peer_base, k as u32);
            let mut labels = Labels::new();
            labels.insert("role", &role);
            s.upsert_pod(pod(&format!("peer-{i}-{j}"), labels, "node-1", ip, vec![]));
            if k + 1 == count {
                client = Some(ip);
            }
            let mut sel = LabelSelector::default();
            sel.match_labels.insert("role".into(), role);
            peers.push(PolicyPeer { pod_selector: Some(sel), ..Default::default() });
        }
        s.upsert_policy(server_policy(format!("pod-selectors-{i:05}"), peers));
    }
    let Some(client) = client else { bail!("pod_selectors: no client pod") };
    let what = format!(
        "{p} NetworkPolicies in namespace {NS} select the server pod, each allowing TCP {PORT} from one ingress rule of {b} podSelector peers, each selecting one pod of the namespace ({count} peer pods, on another node); the client is the pod of the last policy's last peer"
    );
    hand_built("pod_selectors", what, s, client, args.flock_options())
}

fn hand_built(name: &'static str, what: String, s: Snapshot, client: IpAddr, options: RenderOptions) -> anyhow::Result<Scenario> {
    let endpoints = s.derived_endpoints("node-0");
    let Some(server) = endpoints.first().cloned() else { bail!("{name}: no server endpoint") };
    let np = translate::translate(&s, &endpoints, &Options::default());
    if let Some(p) = np.problems.first() {
        bail!("{name}: the generated policies have problems, first: {p}");
    }
    let flock = render::render_with(&np, &options);
    let conntrack_only =
        render::render_with(&translate::translate(&without_policies(&s), &endpoints, &Options::default()), &CONNTRACK_ONLY);
    let server_addr = server.addrs[0];
    let denied = Some(IpAddr::V4(DENIED_V4));
    let sc = Scenario {
        name,
        what,
        route: Route::Forward,
        local: server,
        server_addr,
        port: PORT,
        client,
        denied,
        denied_port: None,
        flock,
        conntrack_only,
    };
    checked(sc)
}

/// Admin and Baseline ClusterNetworkPolicies in the `admin_tiers` scenario (the issue's
/// `--admin-policies 100 --baseline-policies 20`).
const ADMIN_TIER: usize = 100;
const BASELINE_TIER: usize = 20;

/// (e) The admin tiers in front of the server: [`ADMIN_TIER`] Admin policies select it, all
/// but the last denying TCP [`PORT`] from one other pod each, the last accepting the client
/// pod; [`BASELINE_TIER`] Baseline policies deny from one other pod each, the last from every
/// pod. The client's first packet meets every Admin rule before its accept.
fn admin_tiers(args: &DataplaneArgs) -> anyhow::Result<Scenario> {
    let mut s = base_snapshot();
    let peer_base = Ipv4Addr::new(198, 18, 1, 0);
    let client = addr4(peer_base, 0);
    let mut role_pod = |k: u32, role: &str| {
        let mut labels = Labels::new();
        labels.insert("role", role);
        s.upsert_pod(pod(role, labels, "node-1", addr4(peer_base, k), vec![]));
    };
    role_pod(0, "client");
    let subject = serde_json::json!({"pods": {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: NS}}, "podSelector": {"matchLabels": {"app": "server"}}}});
    let from_role = |role: &str| serde_json::json!([{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": role}}}}]);
    let on_port = serde_json::json!([{"tcp": {"destinationPort": {"number": PORT}}}]);
    let mut policies = Vec::new();
    for i in 0..ADMIN_TIER {
        let (action, from) = if i + 1 == ADMIN_TIER {
            ("Accept", from_role("client"))
        } else {
            let role = format!("blocked-{i}");
            role_pod(1 + i as u32, &role);
            ("Deny", from_role(&role))
        };
        policies.push(serde_json::json!({
            "metadata": {"name": format!("admin-{i:03}")},
            "spec": {"tier": "Admin", "priority": i, "subject": subject,
                     "ingress": [{"name": "r", "action": action, "from": from, "protocols": on_port}]},
        }));
    }
    for i in 0..BASELINE_TIER {
        let from = if i + 1 == BASELINE_TIER {
            serde_json::json!([{"namespaces": {}}])
        } else {
            let role = format!("other-{i}");
            role_pod(1 + (ADMIN_TIER + i) as u32, &role);
            from_role(&role)
        };
        policies.push(serde_json::json!({
            "metadata": {"name": format!("baseline-{i:03}")},
            "spec": {"tier": "Baseline", "priority": i, "subject": subject,
                     "ingress": [{"name": "r", "action": "Deny", "from": from, "protocols": on_port}]},
        }));
    }
    for p in &policies {
        s.upsert_cluster_policy(flock::model::cnp::from_json(p).map_err(|e| anyhow::anyhow!("admin_tiers: {e}"))?);
    }
    let what = format!(
        "{ADMIN_TIER} Admin ClusterNetworkPolicies select the server pod, the first {} each denying TCP {PORT} from one other pod, the last accepting the client pod; {BASELINE_TIER} Baseline ones deny from one other pod each, the last from every pod (the client's first packet passes every Admin rule before its accept)",
        ADMIN_TIER - 1
    );
    hand_built("admin_tiers", what, s, client, args.flock_options())
}

/// `sc`, once the tracer agrees with it before the kernel is asked: the client accepted,
/// the denied source or port dropped.
fn checked(sc: Scenario) -> anyhow::Result<Scenario> {
    let table = traced_table(&sc.flock)?;
    let t = trace_syn(&table, &sc, sc.client, sc.port)?;
    if t.verdict != Verdict::Accept {
        bail!("{}: the rendered table does not accept the client {}:\n{t}", sc.name, sc.client);
    }
    let denied = sc.denied.map(|d| (d, sc.port)).into_iter().chain(sc.denied_port.map(|p| (sc.client, p)));
    for (src, port) in denied {
        let t = trace_syn(&table, &sc, src, port)?;
        if t.verdict != Verdict::Drop {
            bail!("{}: the rendered table does not drop {src} to port {port}:\n{t}", sc.name);
        }
    }
    Ok(sc)
}

/// (d) A pod of the node to the node's own address: `policies` policies select the client
/// pod for egress, each allowing TCP [`PORT`] to `blocks` /32 ipBlocks at random addresses;
/// the node's address is the last block of the last policy.
fn pod_to_node(args: &DataplaneArgs) -> anyhow::Result<Scenario> {
    let (p, b) = (args.dataplane_policies, args.dataplane_blocks);
    let mut s = base_snapshot();
    let node_addr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    let client_addr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 20));
    let mut labels = Labels::new();
    labels.insert("app", "client");
    s.upsert_pod(pod("client", labels, "node-0", client_addr, vec![]));
    let reserved = [client_addr, node_addr, server_pod().ips[0]];
    let mut rng = Rng::new(0x70_0de);
    for i in 0..p {
        let to = random_blocks(&mut rng, b, (i + 1 == p).then_some(node_addr), &reserved);
        let mut client = LabelSelector::default();
        client.match_labels.insert("app".into(), "client".into());
        s.upsert_policy(NetworkPolicy {
            audit: false,
            namespace: NS.into(),
            name: format!("to-node-{i:05}"),
            pod_selector: client,
            policy_types: vec!["Egress".into()],
            ingress: vec![],
            egress: vec![PolicyRule {
                peers: to,
                ports: vec![PolicyPort { protocol: Some("TCP".into()), port: Some(PortRef::Number(i32::from(PORT))), end_port: None }],
            }],
            generation: None,
            egress_domains: None,
        });
    }
    let endpoints = s.derived_endpoints("node-0");
    let Some(local) = endpoints.iter().find(|e| e.addrs.contains(&client_addr)).cloned() else { bail!("pod_to_node: no client endpoint") };
    let np = translate::translate(&s, &endpoints, &Options::default());
    if let Some(problem) = np.problems.first() {
        bail!("pod_to_node: the generated policies have problems, first: {problem}");
    }
    let flock = render::render_with(&np, &args.flock_options());
    // Conntrack alone on this path is no hook at all: the skeleton without its input chains
    // (as flock's table was before it policed pods' traffic to their node).
    let mut conntrack_only =
        render::render_with(&translate::translate(&without_policies(&s), &endpoints, &Options::default()), &CONNTRACK_ONLY);
    conntrack_only.objects.retain(|o| ![render::INPUT_CHAIN, render::TO_NODE].contains(&o.name()));
    let what = format!(
        "a pod of the node connects to the node's own address {node_addr} (hook input): {p} NetworkPolicies in namespace {NS} select the client pod for egress, each allowing TCP {PORT} to {b} /32 ipBlocks at random addresses of 198.18.0.0/15; the node's address is the last ipBlock of the last policy; TCP {} of the node is the denied flow; conntrack only is the skeleton without the input hook",
        PORT + 1
    );
    checked(Scenario {
        name: "pod_to_node",
        what,
        route: Route::ToNode,
        local,
        server_addr: node_addr,
        port: PORT,
        client: client_addr,
        denied: None,
        denied_port: Some(PORT + 1),
        flock,
        conntrack_only,
    })
}

/// The snapshot's pods and namespaces without any policy: the conntrack-only table.
fn without_policies(s: &Snapshot) -> Snapshot {
    let mut bare = s.clone();
    let policies: Vec<_> = s.policies().map(NetworkPolicy::key).collect();
    for k in &policies {
        bare.remove_policy(k);
    }
    let cnps: Vec<String> = s.cluster_policies().map(|p| p.name.clone()).collect();
    for n in &cnps {
        bare.remove_cluster_policy(n);
    }
    bare
}

/// (c) The synthetic cluster's local pod with the most ingress rules; the client is the
/// remote pod (and the server's TCP port) whose accepting rule comes last in its chains.
fn synthetic_busiest(params: &Params, options: RenderOptions) -> anyhow::Result<Scenario> {
    let cluster = synth::generate(params);
    let s = &cluster.snapshot;
    let endpoints = s.derived_endpoints(&cluster.node);
    let np = translate::translate(s, &endpoints, &Options::default());
    let flock = render::render_with(&np, &options);
    let mut busiest: Option<(usize, &LocalEndpoint)> = None;
    for ep in &endpoints {
        let rules = pod_chains(&flock, &ep.interface, Route::Forward).rules;
        if busiest.is_none_or(|(r, _)| rules > r) {
            busiest = Some((rules, ep));
        }
    }
    let Some((rules, server)) = busiest else { bail!("synthetic_busiest: node {} has no pods", cluster.node) };
    let Some(&server_addr) = server.addrs.first() else { bail!("synthetic_busiest: {} has no address", server.pod) };
    let Some(server_pod) = s.pod_by_name(&server.pod) else { bail!("synthetic_busiest: no pod {}", server.pod) };
    let mut ports: Vec<u16> = server_pod.ports.iter().filter(|p| p.protocol == Protocol::Tcp).map(|p| p.port).collect();
    ports.sort();
    ports.dedup();
    if ports.is_empty() {
        ports.push(PORT);
    }

    // Every remote pod of the server's family on every TCP port of the server: the accepted
    // pair whose accepting rule is deepest; then a source dropped on that port.
    let table = traced_table(&flock)?;
    let chains = pod_chains(&flock, &server.interface, Route::Forward);
    let family = |ip: &IpAddr| ip.is_ipv4() == server_addr.is_ipv4();
    let remote: Vec<IpAddr> = s
        .pods()
        .filter(|p| p.node.as_deref() != Some(cluster.node.as_str()) && p.is_peer())
        .flat_map(|p| p.ips.iter().copied())
        .filter(family)
        .collect();
    let mut best: Option<(usize, IpAddr, u16)> = None;
    let through = |src: IpAddr, port: u16| trace_forward(&table, &server.interface, src, server_addr, port);
    for &src in &remote {
        for &port in &ports {
            let t = through(src, port)?;
            if t.verdict == Verdict::Accept {
                let pos = accepting_position(&flock, &chains, &t).map_or(0, |(_, p)| p);
                if best.is_none_or(|(b, _, _)| pos > b) {
                    best = Some((pos, src, port));
                }
            }
        }
    }
    let Some((_, client, port)) = best else { bail!("synthetic_busiest: no remote pod may connect to {} on TCP {ports:?}", server.pod) };
    let outsider = if server_addr.is_ipv4() {
        IpAddr::V4(DENIED_V4)
    } else {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0xffff, 0, 0, 0, 0xfffe))
    };
    // Besides remote pods, one address in each /25 of 198.18.0.0/15: an ipBlock of the whole
    // range with one node's /25 excepted drops that one.
    let per_block = (0..1024u32).filter(|_| server_addr.is_ipv4()).map(|n| addr4(Ipv4Addr::new(198, 18, 0, 126), n * 128));
    let mut denied = None;
    for src in std::iter::once(outsider).chain(remote.iter().copied()).chain(per_block) {
        if through(src, port)?.verdict == Verdict::Drop {
            denied = Some(src);
            break;
        }
    }
    let conntrack_only = render::render_with(&translate::translate(&without_policies(s), &endpoints, &Options::default()), &CONNTRACK_ONLY);
    let what = format!(
        "the local pod with the most ingress rules ({rules}) of {} in the synthetic cluster of {} pods and {} NetworkPolicies (flock::synth, seed {}, {} pods per node); the client is the remote pod and server port whose accepting rule comes last in the pod's ingress chains (the worst case for that pod)",
        cluster.node, params.pods, params.policies, params.seed, params.pods_per_node
    );
    Ok(Scenario {
        name: "synthetic_busiest",
        what,
        route: Route::Forward,
        local: server.clone(),
        server_addr,
        port,
        client,
        denied,
        denied_port: None,
        flock,
        conntrack_only,
    })
}

/// The rendered table as nft reads it, compiled for tracing (once: scenarios trace many
/// packets through it).
fn traced_table(rs: &Ruleset) -> anyhow::Result<Tracer> {
    let parsed = NftRuleset::from_text(&rs.to_text()).context("reading the rendered table for the tracer")?;
    let table =
        parsed.table(flock::render::names::FAMILY, flock::render::names::TABLE).context("the rendered text has no table inet flock")?;
    Ok(Tracer::new(table))
}

/// A new connection's first packet from the uplink to the server's interface, traced.
fn trace_forward(table: &Tracer, server_if: &str, src: IpAddr, dst: IpAddr, port: u16) -> anyhow::Result<trace::Trace> {
    let pkt = Packet { iif: UPLINK.into(), oif: server_if.into(), src, dst, l4: L4::Tcp, dport: port, ct: Ct::New };
    table
        .trace(render::BASE_CHAIN, &pkt)
        .with_context(|| format!("tracing {src} -> {dst}:{port} (is the tracer up to date with the render?)"))
}

/// A new connection's first packet of scenario `s` from `src` to `port` of its server,
/// traced on the scenario's path.
fn trace_syn(table: &Tracer, s: &Scenario, src: IpAddr, port: u16) -> anyhow::Result<trace::Trace> {
    match s.route {
        Route::Forward => trace_forward(table, &s.local.interface, src, s.server_addr, port),
        Route::ToNode => {
            let pkt = Packet {
                iif: s.local.interface.clone(),
                oif: String::new(),
                src,
                dst: s.server_addr,
                l4: L4::Tcp,
                dport: port,
                ct: Ct::New,
            };
            table
                .trace(render::INPUT_CHAIN, &pkt)
                .with_context(|| format!("tracing {src} -> {}:{port} (is the tracer up to date with the render?)", s.server_addr))
        }
    }
}

/// The 1-based position of a traced rule in its chain.
fn position(rs: &Ruleset, step: &trace::Step) -> Option<(String, usize)> {
    let Some(Object::Chain(c)) = rs.object(&step.chain) else { return None };
    let pos = c.rules.iter().position(|r| r.to_string() == step.rule)?;
    Some((step.chain.clone(), pos + 1))
}

/// The rule of the pod's chains that admitted a trace (its last step in them: the accept of
/// an ingress chain, or an egress chain's `goto egress-allowed` on the way to the node), and
/// its position in its chain.
fn accepting_position(rs: &Ruleset, chains: &PodChains, t: &trace::Trace) -> Option<(String, usize)> {
    let step = t.path.iter().rev().find(|step| chains.chains.contains(&step.chain))?;
    let (_, pos) = position(rs, step)?;
    Some((step.to_string(), pos))
}

/// Rules a traced packet went through, the matching ones included: per chain on its path,
/// up to its last matching rule. (A chain left without a match, by falling off its end, is
/// not on the path and not counted.)
fn rules_evaluated(rs: &Ruleset, t: &trace::Trace) -> usize {
    let mut deepest: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for (chain, pos) in t.path.iter().filter_map(|e| position(rs, e)) {
        let d = deepest.entry(chain).or_default();
        *d = (*d).max(pos);
    }
    deepest.values().sum()
}

/// The chains a packet to (forward) or from (to the node) a pod interface can reach from the
/// ingress or egress map (not the skeleton's), their rules, and the sets those rules look up.
#[derive(Default)]
struct PodChains {
    chains: BTreeSet<String>,
    rules: usize,
    sets: BTreeSet<String>,
    elements: usize,
}

fn pod_chains(rs: &Ruleset, iface: &str, route: Route) -> PodChains {
    let mut out = PodChains::default();
    let key = render::Key::one(render::KeyPart::Ifname(iface.to_string()));
    let map = if route == Route::Forward { render::INGRESS_MAP } else { render::EGRESS_MAP };
    let entry = rs.objects.iter().find_map(|o| match o {
        Object::Set(m) if m.name == map => m.elements.iter().find(|e| e.key == key).and_then(|e| e.verdict.clone()),
        _ => None,
    });
    let skeleton = [render::BASE_CHAIN, render::FROM_PODS, render::TO_PODS, render::EGRESS_ALLOWED, render::INPUT_CHAIN, render::TO_NODE];
    let mut todo: Vec<String> = entry.iter().filter_map(target).collect();
    while let Some(name) = todo.pop() {
        if skeleton.contains(&name.as_str()) || !out.chains.insert(name.clone()) {
            continue;
        }
        let Some(Object::Chain(c)) = rs.object(&name) else { continue };
        out.rules += c.rules.len();
        for rule in c.rules.iter() {
            todo.extend(rule.verdict.as_ref().and_then(target));
            for set in rule.sets() {
                if out.sets.insert(set.to_string())
                    && let Some(Object::Set(s)) = rs.object(set)
                {
                    out.elements += s.elements.len();
                    todo.extend(s.elements.iter().filter_map(|e| e.verdict.as_ref().and_then(target)));
                }
            }
        }
    }
    out
}

/// The chain of a `jump`/`goto` verdict.
fn target(verdict: &render::Verdict) -> Option<String> {
    match verdict {
        render::Verdict::Jump(chain) | render::Verdict::Goto(chain) => Some(chain.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Namespaces and wiring.

/// `addr` as a host address on `eth0` of namespace `ns` (no duplicate address detection).
fn add_address(ns: &str, addr: IpAddr) -> anyhow::Result<()> {
    let cidr = format!("{addr}/{}", if addr.is_ipv4() { 32 } else { 128 });
    let mut args = vec!["ip", "-n", ns, "addr", "add", &cidr, "dev", "eth0"];
    if addr.is_ipv6() {
        args.push("nodad");
    }
    sh(&args)?;
    Ok(())
}

/// The flock or the conntrack-only table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    Flock,
    ConntrackOnly,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Self::Flock => "flock's ruleset",
            Self::ConntrackOnly => "conntrack only",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Flock => "flock",
            Self::ConntrackOnly => "ct",
        }
    }
}

/// One scenario measured: twin topologies, identical but for the table (see the module doc).
struct Topology {
    sides: [Side; 2],
    server_chains: PodChains,
    accepted_by: Option<String>,
    rule_position: Option<usize>,
    /// By the client's first packet (forward chain included), per the tracer.
    rules_evaluated: usize,
    conntrack_max: u64,
}

impl Topology {
    fn new(s: &Scenario, args: &DataplaneArgs) -> anyhow::Result<Self> {
        let server_chains = pod_chains(&s.flock, &s.local.interface, s.route);
        let table = traced_table(&s.flock)?;
        let tr = trace_syn(&table, s, s.client, s.port)?;
        let (accepted_by, rule_position) = accepting_position(&s.flock, &server_chains, &tr).unzip();
        let rules_evaluated = rules_evaluated(&s.flock, &tr);
        let sides = [Side::new(s, Table::Flock, args)?, Side::new(s, Table::ConntrackOnly, args)?];
        let conntrack_max = read_sysctl(&sides[0].node, "net/netfilter/nf_conntrack_max")?;
        Ok(Self { sides, server_chains, accepted_by, rule_position, rules_evaluated, conntrack_max })
    }

    /// One round: `seconds` of load on each side, in alternating slices.
    fn round(&mut self, round: usize, seconds: Duration, clients: usize) -> anyhow::Result<[Load; 2]> {
        let slices = ((seconds.as_secs_f64() / SLICE.as_secs_f64()).round() as u32).max(1);
        let slice = seconds / slices;
        let mut total = [Load::default(), Load::default()];
        for side in &self.sides {
            load(&path(&side.client), side.dst, clients, WARM_UP)?.check().with_context(|| format!("warming up, {}", side.table.name()))?;
        }
        for i in 0..slices as usize {
            let order = if (i + round).is_multiple_of(2) { [0, 1] } else { [1, 0] };
            for k in order {
                let side = &self.sides[k];
                let l = load(&path(&side.client), side.dst, clients, slice)?;
                l.check().with_context(|| side.table.name())?;
                total[k].add(&l);
            }
        }
        for side in &mut self.sides {
            let count = read_sysctl(&side.node, "net/netfilter/nf_conntrack_count")?;
            side.conntrack_peak = side.conntrack_peak.max(count);
            if self.conntrack_max > 0 && count * 10 > self.conntrack_max * 9 {
                bail!("the conntrack table of {} is nearly full ({count} of {}): shorter rounds", side.node.name, self.conntrack_max);
            }
        }
        Ok(total)
    }
}

/// One side of a scenario: client, node and server pod namespaces wired, the node's table
/// applied, the server accepting. Field order is drop order: the server's loop stops before
/// the namespaces go.
struct Side {
    /// Held for their drop (stop the accept loops): the server's, and one on the denied port.
    _server_loop: Server,
    _denied_loop: Option<Server>,
    table: Table,
    dst: SocketAddr,
    conntrack_peak: u64,
    client: NetnsGuard,
    node: NetnsGuard,
    /// The server pod's namespace (none when the server is the node itself).
    _server_ns: Option<NetnsGuard>,
}

impl Side {
    fn new(s: &Scenario, table: Table, args: &DataplaneArgs) -> anyhow::Result<Self> {
        match s.route {
            Route::Forward => Self::forward(s, table, args),
            Route::ToNode => Self::to_node(s, table, args),
        }
    }

    /// The node's table applied in `n`, and its conntrack timeouts set.
    fn apply(s: &Scenario, table: Table, node: &NetnsGuard) -> anyhow::Result<()> {
        let rs = match table {
            Table::Flock => &s.flock,
            Table::ConntrackOnly => &s.conntrack_only,
        };
        let started = Instant::now();
        Applier::new(NftCli::new(Netns::named(&node.name)))
            .defer_baseline()
            .apply(rs)
            .with_context(|| format!("applying {} in {}", table.name(), node.name))?;
        eprintln!("dataplane: {}: {} applied in {:.2}s", s.name, table.name(), started.elapsed().as_secs_f64());
        // The table's `ct` expressions have enabled conntrack in the namespace.
        for (key, value) in CT_TIMEOUTS {
            sysctl(node, key, value)?;
        }
        Ok(())
    }

    /// A client pod wired to the node as flock-cni wires pods, the server on the node's own
    /// address (on `lo`), a second server on the denied port.
    fn to_node(s: &Scenario, table: Table, args: &DataplaneArgs) -> anyhow::Result<Self> {
        let tag = format!("{}-{}", s.name.replace('_', "-"), table.tag());
        let client = netns(&format!("{tag}-client"))?;
        let node = netns(&format!("{tag}-node"))?;
        let (c, n) = (client.name.as_str(), node.name.as_str());
        let iface = s.local.interface.as_str();
        let fam = if s.server_addr.is_ipv6() { "-6" } else { "-4" };
        let host = |a: IpAddr| format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
        for ns in [&client, &node] {
            sysctl(ns, "net.ipv6.conf.all.accept_dad", "0")?;
            sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")?;
        }
        sysctl(&client, "net.ipv4.ip_local_port_range", "1024 65535")?;
        sysctl(&client, "net.ipv4.tcp_tw_reuse", "1")?;
        sysctl(&node, "net.core.somaxconn", "4096")?;
        sh(&[
            "ip",
            "-n",
            n,
            "link",
            "add",
            iface,
            "address",
            MAC_POD_HOST,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "address",
            MAC_CLIENT,
            "netns",
            c,
        ])?;
        for (ns, dev) in [(n, iface), (c, "eth0"), (n, "lo")] {
            sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
        }
        sh(&["ip", fam, "-n", n, "addr", "add", &host(s.server_addr), "dev", "lo"])?;
        add_address(c, s.client)?;
        sh(&["ip", fam, "-n", n, "route", "add", &host(s.client), "dev", iface])?;
        sh(&["ip", "-n", n, "neigh", "replace", &s.client.to_string(), "lladdr", MAC_CLIENT, "dev", iface, "nud", "permanent"])?;
        sh(&["ip", fam, "-n", c, "route", "add", &host(s.server_addr), "dev", "eth0", "src", &s.client.to_string()])?;
        sh(&["ip", "-n", c, "neigh", "replace", &s.server_addr.to_string(), "lladdr", MAC_POD_HOST, "dev", "eth0", "nud", "permanent"])?;
        Self::apply(s, table, &node)?;

        let dst = SocketAddr::new(s.server_addr, s.port);
        let server_loop = Server::start(&path(&node), dst, args.dataplane_servers).with_context(|| format!("server in {n}"))?;
        let denied_loop = match s.denied_port {
            Some(port) => {
                Some(Server::start(&path(&node), SocketAddr::new(s.server_addr, port), 1).with_context(|| format!("server in {n}"))?)
            }
            None => None,
        };
        let client_ns = path(&client);
        probe(&client_ns, Some(s.client), dst, CONNECT_TIMEOUT).with_context(|| format!("{} -> {dst} with {}", s.client, table.name()))?;
        if let Some(port) = s.denied_port {
            let denied = SocketAddr::new(s.server_addr, port);
            match (table, probe(&client_ns, Some(s.client), denied, DENIED_TIMEOUT)) {
                (Table::Flock, Ok(())) => bail!("flock's ruleset in {n} let {} connect to {denied}, which the policies deny", s.client),
                (Table::ConntrackOnly, Err(e)) => return Err(e.context(format!("{} -> {denied} with {}", s.client, table.name()))),
                _ => {}
            }
        }
        Ok(Self { _server_loop: server_loop, _denied_loop: denied_loop, table, dst, conntrack_peak: 0, client, node, _server_ns: None })
    }

    /// Client, node and server pod namespaces, the client routed over the node's uplink.
    fn forward(s: &Scenario, table: Table, args: &DataplaneArgs) -> anyhow::Result<Self> {
        let tag = format!("{}-{}", s.name.replace('_', "-"), table.tag());
        let client = netns(&format!("{tag}-client"))?;
        let node = netns(&format!("{tag}-node"))?;
        let server = netns(&format!("{tag}-server"))?;
        let v6 = s.server_addr.is_ipv6();
        let (c, n, sv) = (client.name.as_str(), node.name.as_str(), server.name.as_str());
        let iface = s.local.interface.as_str();

        for ns in [&client, &node, &server] {
            sysctl(ns, "net.ipv6.conf.all.accept_dad", "0")?;
            sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")?;
        }
        sysctl(&node, "net.ipv4.ip_forward", "1")?;
        sysctl(&node, "net.ipv6.conf.all.forwarding", "1")?;
        sysctl(&client, "net.ipv4.ip_local_port_range", "1024 65535")?;
        sysctl(&client, "net.ipv4.tcp_tw_reuse", "1")?;
        sysctl(&server, "net.core.somaxconn", "4096")?;

        sh(&[
            "ip", "-n", n, "link", "add", UPLINK, "address", MAC_UPLINK, "type", "veth", "peer", "name", "eth0", "address", MAC_CLIENT,
            "netns", c,
        ])?;
        sh(&[
            "ip",
            "-n",
            n,
            "link",
            "add",
            iface,
            "address",
            MAC_POD_HOST,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "address",
            MAC_SERVER,
            "netns",
            sv,
        ])?;
        for (ns, dev) in [(n, UPLINK), (n, iface), (c, "eth0"), (sv, "eth0")] {
            sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
        }
        let host = |a: IpAddr| format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
        let fam = if v6 { "-6" } else { "-4" };
        let mut sources = vec![s.client];
        sources.extend(s.denied);
        for src in &sources {
            if src.is_ipv6() != v6 {
                bail!("{src} and the server's {} are of different families", s.server_addr);
            }
            add_address(c, *src)?;
            sh(&["ip", fam, "-n", n, "route", "add", &host(*src), "dev", UPLINK])?;
            sh(&["ip", "-n", n, "neigh", "replace", &src.to_string(), "lladdr", MAC_CLIENT, "dev", UPLINK, "nud", "permanent"])?;
            sh(&["ip", fam, "-n", sv, "route", "add", &host(*src), "dev", "eth0"])?;
            sh(&["ip", "-n", sv, "neigh", "replace", &src.to_string(), "lladdr", MAC_POD_HOST, "dev", "eth0", "nud", "permanent"])?;
        }
        let dst_ip = s.server_addr;
        add_address(sv, dst_ip)?;
        sh(&["ip", fam, "-n", n, "route", "add", &host(dst_ip), "dev", iface])?;
        sh(&["ip", "-n", n, "neigh", "replace", &dst_ip.to_string(), "lladdr", MAC_SERVER, "dev", iface, "nud", "permanent"])?;
        // The client's own address as source, not the denied one beside it.
        sh(&["ip", fam, "-n", c, "route", "add", &host(dst_ip), "dev", "eth0", "src", &s.client.to_string()])?;
        sh(&["ip", "-n", c, "neigh", "replace", &dst_ip.to_string(), "lladdr", MAC_UPLINK, "dev", "eth0", "nud", "permanent"])?;

        Self::apply(s, table, &node)?;

        let dst = SocketAddr::new(dst_ip, s.port);
        let server_loop = Server::start(&path(&server), dst, args.dataplane_servers).with_context(|| format!("server in {sv}"))?;
        // Without policy both sources connect (the wiring is right); with flock's table the
        // client does and the denied one does not (the table is what decides).
        let client_ns = path(&client);
        probe(&client_ns, Some(s.client), dst, CONNECT_TIMEOUT).with_context(|| format!("{} -> {dst} with {}", s.client, table.name()))?;
        if let Some(d) = s.denied {
            let connected = probe(&client_ns, Some(d), dst, DENIED_TIMEOUT);
            match (table, connected) {
                (Table::Flock, Ok(())) => bail!("flock's ruleset in {n} let {d} connect to {dst}, which the policies deny"),
                (Table::ConntrackOnly, Err(e)) => return Err(e.context(format!("{d} -> {dst} with {}", table.name()))),
                _ => {}
            }
        }
        Ok(Self { _server_loop: server_loop, _denied_loop: None, table, dst, conntrack_peak: 0, client, node, _server_ns: Some(server) })
    }
}

/// A `/proc/sys` number as seen from inside `ns`.
fn read_sysctl(ns: &NetnsGuard, key: &str) -> anyhow::Result<u64> {
    let file = Path::new("/proc/sys").join(key);
    let text = flock::netns::run_in(&Netns::named(&ns.name), || std::fs::read_to_string(&file))
        .with_context(|| format!("entering {}", ns.name))?
        .with_context(|| format!("reading {} in {}", file.display(), ns.name))?;
    text.trim().parse().with_context(|| format!("{} in {}: {text:?}", file.display(), ns.name))
}

/// Deletes this process's `flkt-<pid>-dp…` namespaces and exits on SIGINT, SIGTERM or SIGHUP
/// (otherwise they would stay until a later run sweeps them).
fn remove_on_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the signal runtime")?;
    let (mut int, mut term, mut hup) = {
        let _entered = rt.enter();
        (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?, signal(SignalKind::hangup())?)
    };
    std::thread::spawn(move || {
        let number = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => nix::libc::SIGINT,
                _ = term.recv() => nix::libc::SIGTERM,
                _ = hup.recv() => nix::libc::SIGHUP,
            }
        });
        INTERRUPTED.store(true, Ordering::SeqCst);
        flock::sim::fabric::kill_children();
        let mine = format!("{PREFIX}{}-dp", std::process::id());
        if let Ok(list) = sh(&["ip", "netns", "list"]) {
            for name in list.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(&mine)) {
                let _ = sh(&["ip", "netns", "del", name]);
            }
        }
        let _ = writeln!(std::io::stderr(), "interrupted: the benchmark's network namespaces were removed");
        std::process::exit(128 + number);
    });
    Ok(())
}
