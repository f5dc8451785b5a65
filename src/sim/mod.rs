//! The simulated cluster: nodes and pods as network namespaces on one machine, pods wired by
//! the real flock-cni (executed as a runtime would, with Debian's plugins), each node's rules
//! produced by the real node agent core and applied with real nft, flock's own servers on
//! every declared port, and probes between them. It is `flockctl sim`, the conformance runner
//! and the end-to-end test bed.
//!
//! Topology: a fabric namespace with a bridge; every node and host has an `eth0` on it with
//! its addresses (a node's InternalIPs); nodes route to each other's pod CIDRs via their
//! InternalIPs (programmed by the agent core, as on a real cluster). A node with an IPv6 pod
//! CIDR but no IPv6 InternalIP gets one from `2001:db8:ffff::/64` (and an IPv4 one from
//! `198.19.255.0/24` when it has none) so the fabric can route both families; the snapshot
//! the agents see carries those addresses.
//!
//! The simulation's pods follow the snapshot: a pod scheduled on a simulated node, live, not
//! host-networked, gets a sandbox (its manifest addresses requested from IPAM); a pod whose
//! uid or addresses change gets a new sandbox; a pod that disappears or terminates is torn
//! down with CNI DEL. Labels and policies change under running pods.
//!
//! A host-network pod runs in its node's namespace, as on a real node: its addresses are
//! the node's InternalIPs (reported in its status when the manifest gives none, as kubelet
//! does), its container ports are served there (one server per port and protocol for every
//! host-network pod of the node), and probes from it start in the node's namespace.

pub mod dns;
pub mod fabric;
pub mod probe;
pub mod runner;
pub mod servers;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flock_cni::runtime::{ConfList, Runtime, Sandbox};
use ipnet::IpNet;
use serde_json::{Value, json};

use crate::agent::{Agent, AgentConfig};
use crate::model::Family;
use crate::model::{ObjectRef, Pod, Protocol, Snapshot};
use crate::netns::Netns;
use crate::source::StaticSource;
use crate::translate;
use fabric::Fabric;
pub use probe::Outcome;

/// Why the simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Plumbing(#[from] fabric::PlumbingError),
    #[error("node {node}: {message}")]
    Node { node: String, message: String },
    #[error("pod {pod}: {message}")]
    Pod { pod: String, message: String },
    #[error("host {host}: {message}")]
    Host { host: String, message: String },
    #[error("{0}")]
    Other(String),
    /// A signal stopped the simulation ([`fabric::interrupt`]).
    #[error("interrupted")]
    Interrupted,
}

/// A non-pod host on the fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub(crate) name: String,
    pub(crate) addrs: Vec<IpAddr>,
}

impl std::str::FromStr for HostSpec {
    type Err = String;
    /// `NAME=ADDR[,ADDR]`
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, addrs) = s.split_once('=').ok_or(format!("{s:?}: expected NAME=ADDR[,ADDR]"))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("{name:?}: a host name is letters, digits and '-'"));
        }
        let addrs = addrs
            .split(',')
            .map(|a| a.parse::<IpAddr>().map_err(|_| format!("{a:?} is not an IP address")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { name: name.to_string(), addrs })
    }
}

/// How to build the simulation.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Directory holding the `flock-cni` binary.
    pub cni_bin_dir: PathBuf,
    /// Directories with the other CNI plugins (`loopback`, `host-local`).
    pub cni_path: Vec<PathBuf>,
    pub hosts: Vec<HostSpec>,
    /// Ports served on hosts.
    pub host_ports: Vec<(u16, Protocol)>,
    pub probe_timeout: Duration,
    pub parallelism: usize,
    pub translate: translate::Options,
    /// How long to wait for the agents to commit a change.
    pub sync_timeout: Duration,
    /// How long to wait for what a change brings up to work before probing: a new pod's link
    /// ([`fabric::wait_link_up`]), a case's DNS server answering ([`Sim::set_dns`]).
    pub ready_timeout: Duration,
    /// The agents cut connections a change denies (`--revoke-denied-flows`).
    pub revoke: bool,
    /// The agents run their DNS proxy (`--dns-resolvers`): domain rules are enforced.
    pub dns: Option<crate::dns_proxy::DnsConfig>,
    /// How the nodes are connected: one L2 segment, or each behind a router.
    pub underlay: Underlay,
    /// Whether the routed underlay lets a member send from addresses that are not its own.
    pub underlay_spoofing: UnderlaySpoofing,
    /// How the agents route to other nodes' pods (`--routing`).
    pub routing: crate::agent::routes::RoutingConfig,
}

/// The simulated cluster's underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underlay {
    /// Every node and host on one bridge (on-link with each other).
    #[default]
    L2,
    /// Every node and host behind its own port of a router: none on-link with another, so
    /// host-gw cannot reach another node.
    Routed,
}

impl std::str::FromStr for Underlay {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "l2" => Ok(Self::L2),
            "routed" => Ok(Self::Routed),
            other => Err(format!("{other:?}: l2 or routed")),
        }
    }
}

/// What a routed underlay does with a packet whose source is not its sender's: drop it, as
/// cloud VPCs do (each port may send from its member's addresses and, for a node, its pod
/// CIDRs), or forward it, as a plain router does (the forged-outer attack on the overlay:
/// a node, or a host-network pod with CAP_NET_RAW, sending VXLAN as another node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnderlaySpoofing {
    #[default]
    Validated,
    Allowed,
}

impl std::str::FromStr for UnderlaySpoofing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "validated" => Ok(Self::Validated),
            "allowed" => Ok(Self::Allowed),
            other => Err(format!("{other:?}: validated or allowed")),
        }
    }
}

impl std::fmt::Display for UnderlaySpoofing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Validated => "validated",
            Self::Allowed => "allowed",
        })
    }
}

impl std::fmt::Display for Underlay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::L2 => "l2",
            Self::Routed => "routed",
        })
    }
}

impl SimOptions {
    /// The agents run their DNS proxy as flock-agent does by default (the cluster DNS —
    /// `kube-system` pods labelled `k8s-app: kube-dns` — is the trusted resolver), except
    /// that TTLs are floored at 1 s, not 30 s, so that cases see records expire quickly, and
    /// a resolver gets 2 s to answer, not 5.
    pub fn with_cluster_dns(mut self) -> Self {
        use crate::dns_proxy as dns;
        self.dns = Some(dns::DnsConfig {
            limits: crate::dns::Limits { min_ttl: 1, ..crate::dns::Limits::default() },
            upstream_timeout: Duration::from_secs(2),
            ..dns::DnsConfig::default()
        });
        self.translate.dns_resolvers = Some(translate::ResolverPods::cluster_dns());
        self
    }

    pub fn new(cni_bin_dir: PathBuf) -> Self {
        Self {
            cni_bin_dir,
            cni_path: vec![PathBuf::from("/usr/lib/cni")],
            hosts: Vec::new(),
            host_ports: Vec::new(),
            probe_timeout: Duration::from_millis(1000),
            parallelism: 48,
            translate: translate::Options::default(),
            sync_timeout: Duration::from_secs(30),
            ready_timeout: Duration::from_secs(10),
            revoke: true,
            dns: None,
            underlay: Underlay::L2,
            underlay_spoofing: UnderlaySpoofing::Validated,
            routing: crate::agent::routes::RoutingConfig::default(),
        }
    }
}

/// The denials the agents read while it lives ([`Sim::collect_denials`]).
pub struct DenialCollector {
    receivers: Vec<(String, tokio::sync::broadcast::Receiver<crate::nflog::denial::Denial>)>,
}

/// One denial, on the node whose agent read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDenial {
    pub node: String,
    pub denial: crate::nflog::denial::Denial,
}

impl DenialCollector {
    /// Waits `settle` for records still on their way (the kernel sends them at once; the
    /// agents read them within milliseconds), then returns them, node by node in arrival
    /// order. Records beyond what a node's channel holds are counted as `lost`.
    pub async fn take(mut self, settle: Duration) -> (Vec<NodeDenial>, u64) {
        tokio::time::sleep(settle).await;
        let (mut out, mut lost) = (Vec::new(), 0);
        for (node, rx) in &mut self.receivers {
            loop {
                match rx.try_recv() {
                    Ok(denial) => out.push(NodeDenial { node: node.clone(), denial }),
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => lost += n,
                    Err(_) => break,
                }
            }
        }
        (out, lost)
    }
}

struct SimNode {
    ns: String,
    agent: Agent,
    /// What its agent was started with (a restart starts the same).
    config: AgentConfig,
    dir: PathBuf,
    fabric_addrs: Vec<IpAddr>,
    /// The servers of the node's host-network pods, and the ports they serve.
    host_servers: Option<(Vec<(u16, Protocol)>, servers::Servers)>,
}

struct SimPod {
    key: ObjectRef,
    ns: String,
    node: String,
    ips: Vec<IpAddr>,
    sandbox: Sandbox,
    result: Value,
    _servers: servers::Servers,
    unavailable: Vec<(u16, Protocol)>,
}

struct SimHost {
    ns: String,
    addrs: Vec<IpAddr>,
    _servers: servers::Servers,
}

/// A running simulation.
pub struct Sim {
    fabric: Arc<Fabric>,
    source: StaticSource,
    nodes: BTreeMap<String, SimNode>,
    /// By pod uid.
    pods: BTreeMap<String, SimPod>,
    hosts: BTreeMap<String, SimHost>,
    opts: SimOptions,
    next_pod: usize,
    keep: bool,
    torn_down: bool,
    /// Simulations kept by earlier runs, left in place by this one's sweep.
    kept_elsewhere: Vec<(String, usize)>,
    /// The cluster DNS of a conformance case ([`Sim::set_dns`]).
    dns: Option<ClusterDns>,
}

/// The cluster DNS a case declares, and its server while the pod has a sandbox.
struct ClusterDns {
    spec: crate::conformance::DnsSpec,
    /// The server pod's namespace, addresses and zone it serves, and the server.
    running: Option<(String, Vec<IpAddr>, dns::Zone, dns::DnsServer)>,
}

/// What one probe asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeSpec {
    pub port: u16,
    pub protocol: Protocol,
    /// `None`: each destination's primary address (its first pod IP) decides the family.
    pub family: Option<Family>,
}

/// One cell: `None` when it could not be probed (no address of the family on one side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub from: String,
    pub to: String,
    pub family: Family,
    pub outcome: Option<Outcome>,
}

impl Sim {
    /// Builds the simulation for `snapshot`.
    pub async fn build(snapshot: Snapshot, opts: SimOptions) -> Result<Self, SimError> {
        let swept = fabric::sweep(fabric::Sweep::Crashed);
        let routed = opts.underlay == Underlay::Routed;
        let fabric = Arc::new(Fabric::new(routed, routed && opts.underlay_spoofing == UnderlaySpoofing::Validated)?);
        let mut snapshot = snapshot;
        augment_nodes(&mut snapshot)?;
        let source = StaticSource::new(snapshot.clone());
        let mut sim = Sim {
            fabric,
            source,
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            hosts: BTreeMap::new(),
            opts,
            next_pod: 0,
            keep: false,
            torn_down: false,
            kept_elsewhere: swept.kept,
            dns: None,
        };
        let work = sim.fabric.work_dir();
        std::fs::create_dir_all(&work).map_err(|e| SimError::Other(format!("cannot create {}: {e}", work.display())))?;

        let node_names: Vec<String> = snapshot.nodes().map(|n| n.name.clone()).collect();
        for p in snapshot.pods().filter(|p| wants_sandbox(p)) {
            if let Some(n) = &p.node
                && snapshot.node(n).is_none()
            {
                return Err(SimError::Pod {
                    pod: p.key().to_string(),
                    message: format!("node {n} has no Node object (the simulation needs its podCIDRs and InternalIP)"),
                });
            }
        }
        for (i, name) in node_names.iter().enumerate() {
            let node = snapshot.node(name).cloned().ok_or_else(|| SimError::Other(format!("node {name} vanished")))?;
            if node.pod_cidrs.is_empty() {
                return Err(SimError::Node { node: name.clone(), message: "needs spec.podCIDR(s)".into() });
            }
            let ns = sim.fabric.ns_name("n", i);
            sim.fabric.add_netns(&ns)?;
            sim.fabric.attach(&ns, &node.internal_ips)?;
            sim.fabric.sysctl(&ns, "net.ipv4.ip_forward", "1")?;
            sim.fabric.sysctl(&ns, "net.ipv6.conf.all.forwarding", "1")?;
            sim.fabric.default_routes(&ns)?;
            let dir = work.join(format!("n{i}"));
            let mut cfg = AgentConfig::new(name, Netns::named(&ns), dir.join("cni.sock"), dir.join("pending-del"));
            cfg.state_dir = Some(dir.join("agent"));
            cfg.translate = sim.opts.translate.clone();
            cfg.revoke = sim.opts.revoke.then_some(crate::render::REVOKED_MARK);
            cfg.coalesce = Duration::from_millis(10);
            cfg.dns = sim.opts.dns.clone();
            cfg.routing = sim.opts.routing.clone();
            let agent = Agent::start(cfg.clone(), sim.source.subscribe())
                .await
                .map_err(|e| SimError::Node { node: name.clone(), message: e.to_string() })?;
            sim.nodes
                .insert(name.clone(), SimNode { ns, agent, config: cfg, dir, fabric_addrs: node.internal_ips.clone(), host_servers: None });
        }
        for (k, h) in sim.opts.hosts.clone().iter().enumerate() {
            let ns = sim.fabric.ns_name("h", k);
            sim.fabric.add_netns(&ns)?;
            sim.fabric.attach(&ns, &h.addrs)?;
            if sim.fabric.routed {
                sim.fabric.default_routes(&ns)?;
                sim.fabric.admit_host(&ns)?;
            }
            let servers = servers::Servers::start(Netns::named(&ns), sim.opts.host_ports.clone())
                .map_err(|message| SimError::Host { host: h.name.clone(), message })?;
            sim.hosts.insert(h.name.clone(), SimHost { ns, addrs: h.addrs.clone(), _servers: servers });
        }
        sim.fabric_routes()?;
        sim.wait_synced(1).await?;
        sim.reconcile_pods().await?;
        Ok(sim)
    }

    /// Leaves everything in place when dropped or torn down (for inspection), marked so that
    /// later simulations do not sweep it (see [`fabric::Fabric::mark_kept`]).
    pub fn keep(&mut self) -> Result<(), SimError> {
        let dir = self.fabric.work_dir();
        self.fabric.mark_kept().map_err(|e| SimError::Other(format!("cannot mark the simulation kept in {}: {e}", dir.display())))?;
        self.keep = true;
        Ok(())
    }

    /// Simulations kept by earlier runs (`<pid>-<n>` and namespace count), which stay until
    /// swept with [`fabric::Sweep::AlsoKept`].
    pub fn kept_elsewhere(&self) -> &[(String, usize)] {
        &self.kept_elsewhere
    }

    /// What each network namespace of the simulation is — `node node-1`, `pod shop/db`,
    /// `host <name>`, `fabric` — with its name, nodes first, then pods, hosts and the fabric.
    pub fn netns_roles(&self) -> Vec<(String, String)> {
        let nodes = self.nodes.iter().map(|(name, n)| (format!("node {name}"), n.ns.clone()));
        let mut pods: Vec<(String, String)> = self.pods.values().map(|p| (format!("pod {}", p.key), p.ns.clone())).collect();
        pods.sort();
        let hosts = self.hosts.iter().map(|(name, h)| (format!("host {name}"), h.ns.clone()));
        let mut out: Vec<(String, String)> = nodes.chain(pods).chain(hosts).collect();
        // The rest is the fabric's own (the network joining the nodes).
        let named: BTreeSet<String> = out.iter().map(|(_, ns)| ns.clone()).collect();
        out.extend(self.fabric.namespaces().into_iter().filter(|ns| !named.contains(ns)).map(|ns| ("fabric".to_string(), ns)));
        out
    }

    /// The node namespace of `node`.
    pub fn node_netns(&self, node: &str) -> Option<String> {
        self.nodes.get(node).map(|n| n.ns.clone())
    }

    /// The namespace of host `name`.
    pub fn host_netns(&self, name: &str) -> Option<String> {
        self.hosts.get(name).map(|h| h.ns.clone())
    }

    /// The pod namespace of `namespace/name`.
    pub fn pod_netns(&self, key: &str) -> Option<String> {
        self.pods.values().find(|p| p.key.to_string() == key).map(|p| p.ns.clone())
    }

    /// The current snapshot (as the agents see it).
    pub fn snapshot(&self) -> Snapshot {
        self.source.current().1
    }

    /// Changes the cluster with `f`, brings sandboxes in line and waits until every node has
    /// committed the change (and, with revocation, judged its connections against it), every
    /// new sandbox's link works ([`fabric::wait_link_up`]) and a case's DNS server that
    /// (re)started answers ([`Sim::set_dns`]).
    pub async fn apply(&mut self, f: impl FnOnce(&mut Snapshot)) -> Result<(), SimError> {
        let mut err = None;
        let version = self.source.update(|s| {
            f(s);
            if let Err(e) = augment_nodes(s) {
                err = Some(e);
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        self.fabric_routes()?;
        self.wait_synced(version).await?;
        self.reconcile_pods().await?;
        self.refresh_dns()
    }

    /// Serves `spec` (a conformance case's `dns`) from its server pod while the pod has a
    /// sandbox, following its addresses and those of the pods its records name; `None` stops
    /// serving. The server pod's port 53 (UDP and TCP) is the DNS server's, not an echo
    /// server's. The agents trust the server as any resolver: only if it is one of the pods
    /// [`translate::Options::dns_resolvers`] selects (the cluster DNS). Whenever the server
    /// (re)starts, this and [`Sim::apply`] return only once it answers a query from its node
    /// ([`dns::wait_answering`]), or fail after [`SimOptions::ready_timeout`] saying so.
    pub(crate) fn set_dns(&mut self, spec: Option<crate::conformance::DnsSpec>) -> Result<(), SimError> {
        self.dns = spec.map(|spec| ClusterDns { spec, running: None });
        self.refresh_dns()
    }

    /// The cluster DNS server's address of `family`, while it serves.
    pub(crate) fn dns_server(&self, family: Family) -> Option<IpAddr> {
        let (_, ips, _, _) = self.dns.as_ref()?.running.as_ref()?;
        ips.iter().copied().find(|ip| Family::of(*ip) == family)
    }

    /// The addresses whose DNS answers the agents learn from on `snapshot`: the resolvers
    /// they are given and the resolver pods they select; none without their DNS proxy.
    pub(crate) fn trusted_resolvers(&self, snapshot: &Snapshot) -> Vec<IpAddr> {
        let Some(dns) = &self.opts.dns else { return Vec::new() };
        let pods = self.opts.translate.dns_resolvers.iter().flat_map(|r| r.addresses(snapshot));
        dns.resolvers.iter().copied().chain(pods).collect()
    }

    /// What the agents trust as resolvers, for messages.
    pub(crate) fn resolver_selector(&self) -> String {
        let Some(dns) = &self.opts.dns else { return "the agents run no DNS proxy".into() };
        let mut parts: Vec<String> = dns.resolvers.iter().map(ToString::to_string).collect();
        if let Some(r) = &self.opts.translate.dns_resolvers {
            parts.push(format!("pods {r}"));
        }
        if parts.is_empty() { "none".into() } else { parts.join(", ") }
    }

    /// (Re)starts the case's DNS server when its pod, its addresses or the zone changed.
    fn refresh_dns(&mut self) -> Result<(), SimError> {
        let snap = self.snapshot();
        let Some(dns) = &mut self.dns else { return Ok(()) };
        let server = &dns.spec.server;
        let want =
            self.pods.values().find(|p| &p.key == server).map(|p| (p.ns.clone(), p.ips.clone(), dns::Zone::for_case(&dns.spec, &snap)));
        let same = match (&want, &dns.running) {
            (Some((ns, ips, zone)), Some((rns, rips, rzone, _))) => ns == rns && ips == rips && zone == rzone,
            (None, None) => true,
            _ => false,
        };
        if same {
            return Ok(());
        }
        // The old server goes first: a new one binds the same port.
        dns.running = None;
        if let Some((ns, ips, zone)) = want {
            let server_ = dns::DnsServer::start(Netns::named(&ns), ips.clone(), zone.clone())
                .map_err(|message| SimError::Pod { pod: server.to_string(), message })?;
            dns.running = Some((ns, ips.clone(), zone, server_));
            // Ready as a kubelet's readiness probe would find it: answering on its addresses,
            // asked from its node across the pod's link. Probes by name come after this.
            let node = self.pods.values().find(|p| &p.key == server).and_then(|p| Some((p.node.clone(), self.nodes.get(&p.node)?)));
            if let Some((node, n)) = node {
                let from = Netns::named(&n.ns);
                let timeout = self.opts.ready_timeout;
                tokio::task::block_in_place(|| dns::wait_answering(&from, &ips, timeout))
                    .map_err(|e| SimError::Pod { pod: server.to_string(), message: format!("{e}, asked from node {node}") })?;
            }
        }
        Ok(())
    }

    /// Stops `node`'s agent and starts a new one with the same configuration (its rules, and
    /// the kernel's connection tracking, stay as they are in between), then waits for the
    /// new one to commit the current state.
    pub async fn restart_agent(&mut self, node: &str) -> Result<(), SimError> {
        let Some(n) = self.nodes.remove(node) else {
            return Err(SimError::Node { node: node.to_string(), message: "no such node".into() });
        };
        let SimNode { ns, agent, config, dir, fabric_addrs, host_servers } = n;
        agent.shutdown().await;
        let agent = Agent::start(config.clone(), self.source.subscribe())
            .await
            .map_err(|e| SimError::Node { node: node.to_string(), message: e.to_string() })?;
        self.nodes.insert(node.to_string(), SimNode { ns, agent, config, dir, fabric_addrs, host_servers });
        // Nothing changes the source: its current version, as the new agent commits it.
        let version = self.source.update(|_| {});
        self.wait_synced(version).await
    }

    async fn wait_synced(&self, version: u64) -> Result<(), SimError> {
        for n in self.nodes.values() {
            // An interrupt removes the namespaces, so the agents cannot commit: stop waiting.
            tokio::select! {
                r = n.agent.wait_source(version, self.opts.sync_timeout) => r.map_err(|e| SimError::Other(e.to_string()))?,
                () = async { while fabric::interrupted().is_none() { tokio::time::sleep(Duration::from_millis(50)).await } } => {
                    return Err(SimError::Interrupted);
                }
            }
        }
        Ok(())
    }

    /// Node and host fabric addresses and routes for the current Node objects.
    fn fabric_routes(&mut self) -> Result<(), SimError> {
        let snap = self.snapshot();
        let mut members: Vec<IpAddr> = Vec::new();
        for (name, node) in self.nodes.iter_mut() {
            let want = snap.node(name).map(|n| n.internal_ips.clone()).unwrap_or_default();
            let new: Vec<IpAddr> = want.iter().filter(|a| !node.fabric_addrs.contains(a)).copied().collect();
            for a in &new {
                let cidr = format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
                fabric::run(&["ip", "-n", &node.ns, "addr", "add", &cidr, "dev", "eth0", "nodad"])
                    .or_else(|_| fabric::run(&["ip", "-n", &node.ns, "addr", "add", &cidr, "dev", "eth0"]))?;
                node.fabric_addrs.push(*a);
                self.fabric.route_member(&node.ns, *a)?;
            }
            members.extend(want);
        }
        // Routed: the members reach each other through the router (their default routes);
        // it routes each node's pod CIDRs via the node, as an underlay's route table would
        // for the hosts outside the cluster.
        if self.fabric.routed {
            for n in snap.nodes() {
                for cidr in &n.pod_cidrs {
                    if let Some(via) = n.internal_ips.iter().find(|ip| ip.is_ipv4() == matches!(cidr, IpNet::V4(_))) {
                        self.fabric.route_via_member(&cidr.to_string(), *via)?;
                    }
                }
            }
            return Ok(());
        }
        for h in self.hosts.values() {
            members.extend(h.addrs.iter().copied());
        }
        let node_ns: Vec<(String, String)> = self.nodes.iter().map(|(k, v)| (k.clone(), v.ns.clone())).collect();
        for (_, ns) in &node_ns {
            for m in &members {
                self.fabric.route(ns, &m.to_string(), None)?;
            }
        }
        for h in self.hosts.values() {
            for m in &members {
                self.fabric.route(&h.ns, &m.to_string(), None)?;
            }
            for n in snap.nodes() {
                for cidr in &n.pod_cidrs {
                    if let Some(via) = n.internal_ips.iter().find(|ip| ip.is_ipv4() == matches!(cidr, IpNet::V4(_))) {
                        self.fabric.route(&h.ns, &cidr.to_string(), Some(*via))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Creates, replaces and removes sandboxes to match the snapshot.
    async fn reconcile_pods(&mut self) -> Result<(), SimError> {
        let snap = self.snapshot();
        let desired: BTreeMap<String, Pod> = snap
            .pods()
            .filter(|p| wants_sandbox(p) && p.node.as_ref().is_some_and(|n| self.nodes.contains_key(n)))
            .map(|p| (p.uid.clone(), p.clone()))
            .collect();
        let stale: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, sp)| desired.get(*uid).is_none_or(|p| p.ips != sp.ips || p.node.as_deref() != Some(&sp.node)))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            if let Some(sp) = self.pods.remove(&uid) {
                self.teardown_pod(sp)?;
            }
        }
        let missing: Vec<Pod> = desired.into_values().filter(|p| !self.pods.contains_key(&p.uid)).collect();
        let mut allocated: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for chunk in missing.chunks(8) {
            let jobs: Vec<(Pod, String, String)> = chunk
                .iter()
                .map(|p| {
                    self.next_pod += 1;
                    (p.clone(), self.fabric.ns_name("p", self.next_pod), format!("{}-{}", p.uid, self.next_pod))
                })
                .collect();
            let built: Vec<Result<SimPod, SimError>> = tokio::task::block_in_place(|| {
                std::thread::scope(|s| {
                    let handles: Vec<_> = jobs.iter().map(|(p, ns, cid)| s.spawn(|| self.create_pod(&snap, p, ns, cid))).collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|_| Err(SimError::Other("a sandbox thread panicked".into()))))
                        .collect()
                })
            });
            for (job, r) in jobs.iter().zip(built) {
                let sp = r?;
                if job.0.ips.is_empty() {
                    allocated.push((job.0.uid.clone(), sp.ips.clone()));
                }
                self.pods.insert(job.0.uid.clone(), sp);
            }
        }
        if !allocated.is_empty() {
            // Like kubelet: report the addresses IPAM chose in the pod's status.
            let version = self.source.update(|s| {
                for (uid, ips) in &allocated {
                    if let Some(mut p) = s.pod(uid).cloned() {
                        p.ips = ips.clone();
                        s.upsert_pod(p);
                    }
                }
            });
            for (uid, ips) in allocated {
                if let Some(sp) = self.pods.get_mut(&uid) {
                    sp.ips = ips;
                }
            }
            self.wait_synced(version).await?;
        }
        self.host_network_servers(&snap)
    }

    /// Serves the container ports of each node's host-network pods in the node's namespace.
    fn host_network_servers(&mut self, snap: &Snapshot) -> Result<(), SimError> {
        for (name, node) in self.nodes.iter_mut() {
            let ports: Vec<(u16, Protocol)> = snap
                .pods()
                .filter(|p| is_host_pod(p) && p.node.as_deref() == Some(name.as_str()))
                .flat_map(|p| p.ports.iter().map(|c| (c.port, c.protocol)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if node.host_servers.as_ref().map(|(p, _)| p) == Some(&ports) || (ports.is_empty() && node.host_servers.is_none()) {
                continue;
            }
            // The old servers go first: the new ones bind the same ports.
            node.host_servers = None;
            if !ports.is_empty() {
                let servers = servers::Servers::start(Netns::named(&node.ns), ports.clone())
                    .map_err(|message| SimError::Node { node: name.clone(), message: format!("host-network pods' ports: {message}") })?;
                node.host_servers = Some((ports, servers));
            }
        }
        Ok(())
    }

    /// The live host-network pods on simulated nodes, by `namespace/name`: (node, addresses).
    fn host_pods(&self) -> BTreeMap<String, (&SimNode, Vec<IpAddr>)> {
        let snap = self.snapshot();
        snap.pods()
            .filter(|p| is_host_pod(p))
            .filter_map(|p| {
                let node = self.nodes.get(p.node.as_deref()?)?;
                Some((p.key().to_string(), (node, node.fabric_addrs.clone())))
            })
            .collect()
    }

    fn conflist(&self, snap: &Snapshot, node: &str) -> Result<ConfList, SimError> {
        let n = self.nodes.get(node).ok_or_else(|| SimError::Other(format!("no node {node}")))?;
        let cidrs = snap.node(node).map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        let ranges: Vec<Value> = cidrs.iter().map(|c| json!([{"subnet": c.to_string()}])).collect();
        let text = json!({
            "cniVersion": "1.0.0",
            "name": format!("flock-sim-{node}"),
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "flock-cni",
                    "agentSocket": n.dir.join("cni.sock"),
                    "stateDir": n.dir.join("cni-state"),
                    "pendingDelDir": n.dir.join("pending-del"),
                    "capabilities": {"ips": true},
                    "ipam": {"type": "host-local", "dataDir": n.dir.join("ipam"), "ranges": ranges}
                }
            ]
        })
        .to_string();
        ConfList::parse(&text).map_err(SimError::Other)
    }

    fn runtime(&self, node: &str) -> Runtime {
        let mut path = vec![self.opts.cni_bin_dir.clone()];
        path.extend(self.opts.cni_path.iter().cloned());
        Runtime { cni_path: path, netns: Netns::named(self.nodes.get(node).map(|n| n.ns.as_str()).unwrap_or_default()) }
    }

    fn create_pod(&self, snap: &Snapshot, p: &Pod, ns: &str, container_id: &str) -> Result<SimPod, SimError> {
        let key = p.key();
        let err = |message: String| SimError::Pod { pod: key.to_string(), message };
        let node = p.node.clone().unwrap_or_default();
        let cidrs = snap.node(&node).map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        let mut ips = Vec::new();
        for ip in &p.ips {
            let cidr = cidrs.iter().find(|c| c.contains(ip)).ok_or_else(|| err(format!("{ip} is outside node {node}'s pod CIDRs")))?;
            ips.push(Value::String(format!("{ip}/{}", cidr.prefix_len())));
        }
        self.fabric.add_netns(ns)?;
        let mut sandbox = Sandbox::for_pod(container_id, &format!("/run/netns/{ns}"), &p.namespace, &p.name, Some(&p.uid));
        if !ips.is_empty() {
            sandbox.capability_args.insert("ips".into(), Value::Array(ips));
        }
        let conf = self.conflist(snap, &node)?;
        let result = match self.runtime(&node).add(&conf, &sandbox) {
            Ok(r) => r,
            Err(e) => {
                self.fabric.del_netns(ns);
                return Err(err(format!("CNI ADD failed: {e}")));
            }
        };
        // ADD returns with the pod's links set up, not yet working: what the node sends the
        // pod is dropped until the kernel has activated the node side. A kubelet starts the
        // containers after ADD (seconds later, mostly); here servers and probes follow at once.
        if let Err(e) = self.wait_host_links(&node, &result) {
            let _ = self.runtime(&node).del(&conf, &sandbox, Some(&result));
            self.fabric.del_netns(ns);
            return Err(err(format!("after CNI ADD: {e}")));
        }
        let got: Vec<IpAddr> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse::<IpAddr>().ok())
            .filter(|a| !a.is_loopback())
            .collect();
        let dns_server = self.dns.as_ref().is_some_and(|d| d.spec.server == key);
        let ports: Vec<(u16, Protocol)> = p
            .ports
            .iter()
            .map(|cp| (cp.port, cp.protocol))
            .filter(|(port, proto)| !(dns_server && *port == 53 && *proto != Protocol::Sctp))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let servers = servers::Servers::start(Netns::named(ns), ports).map_err(err)?;
        let unavailable = servers.unavailable.clone();
        Ok(SimPod {
            key,
            ns: ns.to_string(),
            node,
            ips: if p.ips.is_empty() { got } else { p.ips.clone() },
            sandbox,
            result,
            _servers: servers,
            unavailable,
        })
    }

    /// Waits until the node side of each link in a CNI ADD `result` (the interfaces outside
    /// the sandbox) is operationally up ([`fabric::wait_link_up`]).
    fn wait_host_links(&self, node: &str, result: &Value) -> Result<(), SimError> {
        let ns = self.nodes.get(node).map(|n| n.ns.as_str()).ok_or_else(|| SimError::Other(format!("no node {node}")))?;
        let host_side = result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i.get("sandbox").and_then(Value::as_str).is_none_or(str::is_empty))
            .filter_map(|i| i["name"].as_str());
        for link in host_side {
            fabric::wait_link_up(ns, link, self.opts.ready_timeout)?;
        }
        Ok(())
    }

    fn teardown_pod(&self, sp: SimPod) -> Result<(), SimError> {
        let snap = self.snapshot();
        let conf = self.conflist(&snap, &sp.node)?;
        let del = tokio::task::block_in_place(|| self.runtime(&sp.node).del(&conf, &sp.sandbox, Some(&sp.result)));
        let SimPod { ns, key, .. } = sp;
        self.fabric.del_netns(&ns);
        del.map_err(|e| SimError::Pod { pod: key.to_string(), message: format!("CNI DEL failed: {e}") })
    }

    /// Starts collecting the denials every node's agent reads from now on: the kernel's
    /// NFLOG records of what the rulesets drop (rate-limited per pod and direction).
    pub fn collect_denials(&self) -> DenialCollector {
        DenialCollector { receivers: self.nodes.iter().map(|(name, n)| (name.clone(), n.agent.denials())).collect() }
    }

    /// Pods with a sandbox and host-network pods, as `namespace/name`, sorted.
    pub fn pod_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.pods.values().map(|p| p.key.to_string()).collect();
        v.extend(self.host_pods().into_keys());
        v.sort();
        v
    }

    /// Hosts, as `host/NAME`.
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.keys().map(|h| format!("host/{h}")).collect()
    }

    /// Every (port, protocol) some pod declares.
    pub fn declared_ports(&self) -> Vec<(u16, Protocol)> {
        let snap = self.snapshot();
        let set: BTreeSet<(u16, Protocol)> = self
            .pods
            .keys()
            .filter_map(|uid| snap.pod(uid))
            .chain(snap.pods().filter(|p| is_host_pod(p) && p.node.as_ref().is_some_and(|n| self.nodes.contains_key(n))))
            .flat_map(|p| p.ports.iter().map(|c| (c.port, c.protocol)))
            .collect();
        set.into_iter().collect()
    }

    /// The families pods have addresses in.
    pub fn families(&self) -> Vec<Family> {
        let set: BTreeSet<Family> = self.pods.values().flat_map(|p| p.ips.iter().map(|ip| Family::of(*ip))).collect();
        set.into_iter().collect()
    }

    fn addresses(&self, name: &str) -> Option<(Netns, Vec<IpAddr>)> {
        if let Some(h) = name.strip_prefix("host/") {
            return self.hosts.get(h).map(|h| (Netns::named(&h.ns), h.addrs.clone()));
        }
        if let Some(p) = self.pods.values().find(|p| p.key.to_string() == name) {
            return Some((Netns::named(&p.ns), p.ips.clone()));
        }
        // A host-network pod is its node.
        self.host_pods().remove(name).map(|(node, addrs)| (Netns::named(&node.ns), addrs))
    }

    /// Whether the protocol is available in this kernel (decided by the servers).
    pub(crate) fn protocol_available(&self, protocol: Protocol) -> bool {
        protocol != Protocol::Sctp || !self.pods.values().any(|p| p.unavailable.iter().any(|(_, pr)| *pr == protocol))
    }

    /// Probes every ordered pair (`from` pods to `to` pods or hosts, never a pod to itself).
    pub fn probe(&self, spec: ProbeSpec, from: &[String], to: &[String]) -> Result<Vec<Cell>, SimError> {
        let mut cells = Vec::new();
        let mut tasks = Vec::new();
        let mut index = Vec::new();
        for f in from {
            let (src_ns, src_ips) = self.addresses(f).ok_or_else(|| SimError::Other(format!("no pod {f} in the simulation")))?;
            for t in to {
                if f == t {
                    continue;
                }
                let (_, dst_ips) = self.addresses(t).ok_or_else(|| SimError::Other(format!("no pod or host {t} in the simulation")))?;
                let family = spec.family.or_else(|| dst_ips.first().map(|ip| Family::of(*ip))).unwrap_or(Family::V4);
                let dst = dst_ips.iter().find(|ip| Family::of(**ip) == family);
                let has_src = src_ips.iter().any(|ip| Family::of(*ip) == family);
                match (dst, has_src) {
                    (Some(d), true) => {
                        index.push(cells.len());
                        let dst = probe::Dest::Address(SocketAddr::new(*d, spec.port));
                        tasks.push(probe::Task { src: src_ns.clone(), dst, protocol: spec.protocol });
                        cells.push(Cell { from: f.clone(), to: t.clone(), family, outcome: None });
                    }
                    _ => cells.push(Cell { from: f.clone(), to: t.clone(), family, outcome: None }),
                }
            }
        }
        self.run_probes(cells, &tasks, index)
    }

    /// Probes by name: from each of `from`, `host` resolved through the cluster DNS
    /// ([`Self::set_dns`]) in the probe's family (by default the source's first address's),
    /// then a connection to the answer's first address. Cells name the host as `to`.
    pub(crate) fn probe_host(&self, spec: ProbeSpec, host: &str, from: &[String]) -> Result<Vec<Cell>, SimError> {
        let mut cells = Vec::new();
        let mut tasks = Vec::new();
        let mut index = Vec::new();
        for f in from {
            let (src_ns, src_ips) = self.addresses(f).ok_or_else(|| SimError::Other(format!("no pod {f} in the simulation")))?;
            let family = spec.family.or_else(|| src_ips.first().map(|ip| Family::of(*ip))).unwrap_or(Family::V4);
            let has_src = src_ips.iter().any(|ip| Family::of(*ip) == family);
            let resolver = self.dns_server(family);
            if let (Some(resolver), true) = (resolver, has_src) {
                index.push(cells.len());
                let dst = probe::Dest::Name {
                    name: host.to_string(),
                    v6: family == Family::V6,
                    resolver: SocketAddr::new(resolver, 53),
                    port: spec.port,
                };
                tasks.push(probe::Task { src: src_ns.clone(), dst, protocol: spec.protocol });
            }
            cells.push(Cell { from: f.clone(), to: host.to_string(), family, outcome: None });
        }
        self.run_probes(cells, &tasks, index)
    }

    /// Runs `tasks` and gives cell `index[i]` the outcome of task `i`.
    fn run_probes(&self, mut cells: Vec<Cell>, tasks: &[probe::Task], index: Vec<usize>) -> Result<Vec<Cell>, SimError> {
        let outcomes = tokio::task::block_in_place(|| probe::probe_all(tasks, self.opts.probe_timeout, self.opts.parallelism));
        if fabric::interrupted().is_some() {
            // The namespaces went away under the probes: their outcomes mean nothing.
            return Err(SimError::Interrupted);
        }
        for (i, o) in index.into_iter().zip(outcomes) {
            cells[i].outcome = Some(o);
        }
        Ok(cells)
    }

    /// Tears everything down (CNI DEL for every pod, agents stopped, namespaces and work
    /// directory removed) unless [`keep`](Self::keep) was called.
    pub async fn teardown(mut self) -> Result<(), SimError> {
        self.torn_down = true;
        if self.keep {
            for (_, n) in std::mem::take(&mut self.nodes) {
                n.agent.shutdown().await;
            }
            return Ok(());
        }
        let mut first_err = None;
        for (_, sp) in std::mem::take(&mut self.pods) {
            if let Err(e) = self.teardown_pod(sp) {
                first_err.get_or_insert(e);
            }
        }
        self.dns = None;
        for (_, n) in std::mem::take(&mut self.nodes) {
            n.agent.shutdown().await;
        }
        self.hosts.clear();
        self.fabric.teardown();
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if !self.torn_down && !self.keep {
            // An error or a panic on the way: remove everything (pods' interfaces and routes
            // go with their namespaces; leases and sockets with the work directory).
            self.dns = None;
            self.pods.clear();
            self.hosts.clear();
            self.fabric.teardown();
        }
    }
}

/// Whether a pod gets a sandbox: scheduled, live, not host-networked.
fn wants_sandbox(p: &Pod) -> bool {
    p.node.is_some() && !p.phase.is_terminal() && !p.host_network
}

/// A scheduled, live host-network pod: it runs in its node's namespace.
fn is_host_pod(p: &Pod) -> bool {
    p.node.is_some() && !p.phase.is_terminal() && p.host_network
}

/// Gives nodes the fabric addresses the simulation needs (see the module doc), and
/// host-network pods without addresses their node's InternalIPs, as kubelet reports them.
fn augment_nodes(s: &mut Snapshot) -> Result<(), SimError> {
    let nodes: Vec<crate::model::Node> = s.nodes().cloned().collect();
    let all_cidrs: Vec<IpNet> = nodes.iter().flat_map(|n| n.pod_cidrs.clone()).collect();
    for (i, mut n) in nodes.into_iter().enumerate() {
        let idx = u8::try_from(i + 1).map_err(|_| SimError::Other("at most 254 simulated nodes".into()))?;
        let mut changed = false;
        if n.pod_cidrs.iter().any(|c| matches!(c, IpNet::V4(_))) && !n.internal_ips.iter().any(IpAddr::is_ipv4) {
            n.internal_ips.push(IpAddr::from([198, 19, 255, idx]));
            changed = true;
        }
        if n.pod_cidrs.iter().any(|c| matches!(c, IpNet::V6(_))) && !n.internal_ips.iter().any(IpAddr::is_ipv6) {
            n.internal_ips.push(IpAddr::from([0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, u16::from(idx)]));
            changed = true;
        }
        if let Some(clash) = n.internal_ips.iter().find(|ip| all_cidrs.iter().any(|c| c.contains(*ip))) {
            return Err(SimError::Node { node: n.name.clone(), message: format!("InternalIP {clash} is inside a pod CIDR") });
        }
        if changed {
            s.upsert_node(n);
        }
    }
    let unaddressed: Vec<Pod> = s.pods().filter(|p| p.host_network && p.ips.is_empty()).cloned().collect();
    for mut p in unaddressed {
        if let Some(n) = p.node.as_deref().and_then(|n| s.node(n)) {
            p.ips = n.internal_ips.clone();
            s.upsert_pod(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_specs() {
        let h: HostSpec = "internet=198.18.200.1,2001:db8:200::1".parse().unwrap();
        assert_eq!(h.name, "internet");
        assert_eq!(h.addrs.len(), 2);
        assert!("noaddr".parse::<HostSpec>().is_err());
        assert!("bad name=198.18.0.1".parse::<HostSpec>().is_err());
        assert!("h=nope".parse::<HostSpec>().is_err());
    }

    #[test]
    fn nodes_get_fabric_addresses_for_their_families() {
        let mut s = crate::testkit::base_cluster();
        let mut n = s.node("node-2").unwrap().clone();
        n.pod_cidrs.push("2001:db8:2::/64".parse().unwrap());
        s.upsert_node(n);
        augment_nodes(&mut s).unwrap();
        assert_eq!(s.node("node-2").unwrap().internal_ips.len(), 2);
        assert_eq!(s.node("node-1").unwrap().internal_ips.len(), 1);
    }
}
