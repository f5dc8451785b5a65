//! flock-agent: the DaemonSet daemon on every node. Watches Pods, Namespaces,
//! NetworkPolicies and Nodes, serves flock-cni's socket, and keeps table `inet flock` equal
//! to what the policies say for this node's pods.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use flock::agent::AgentConfig;
use flock::agent::cniconf::HostPorts;
use flock::agent::http::ListenAddr;
use flock::crd::AgentPod;
use flock::daemon::{self, DaemonOptions};
use flock::lease::LeaseSettings;
use flock::netns::Netns;
use flock::process::{LogFormat, init_logging, stop_on_signals};
use flock::report::node::NodeStatusOptions;
use flock::report::{ReportOptions, reporter_lease};
use flock::source::kube::{PodSource, SourceOptions, WriterLease};

#[derive(Parser, Debug)]
#[command(
    name = "flock-agent",
    version,
    about = "flock's node agent: NetworkPolicy enforcement with nftables, and the other side of flock-cni"
)]
struct Args {
    /// This node's name (from the downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// flock-cni's socket.
    #[arg(long, env = "FLOCK_CNI_SOCKET", default_value = flock_cni::protocol::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Where flock-cni queues DELs while the agent is down.
    #[arg(long, env = "FLOCK_PENDING_DEL_DIR", default_value = flock_cni::protocol::DEFAULT_PENDING_DEL_DIR)]
    pending_del_dir: PathBuf,
    /// Where the endpoint registry is kept across restarts.
    #[arg(long, env = "FLOCK_STATE_DIR", default_value = "/var/lib/flock")]
    state_dir: PathBuf,
    /// Period of the drift check and full resync.
    #[arg(long, env = "FLOCK_RESYNC_PERIOD", default_value = "30s", value_parser = parse_duration)]
    resync_period: Duration,
    /// How long an ADD waits for its Pod to appear in the watch.
    #[arg(long, env = "FLOCK_POD_WAIT", default_value = "10s", value_parser = parse_duration)]
    pod_wait: Duration,
    /// Address of /healthz, /readyz and /metrics (HOST:PORT or unix:/path).
    #[arg(long, env = "FLOCK_METRICS_ADDRESS", default_value = "[::]:9781")]
    metrics_address: ListenAddr,
    /// Log format.
    #[arg(long, env = "FLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "FLOCK_LOG", default_value = "info")]
    log: String,
    /// Directory of the CNI network configs kubelet's runtime reads.
    #[arg(long, env = "FLOCK_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// File name of flock's network config in that directory.
    #[arg(long, env = "FLOCK_CNI_CONF_NAME", default_value = "10-flock.conflist")]
    cni_conf_name: String,
    /// Do not write the CNI network config (another component manages it).
    #[arg(long, env = "FLOCK_NO_CNI_CONF")]
    no_cni_conf: bool,
    /// MTU of pod interfaces (written into the CNI config). Unset under an overlay: the
    /// underlay's less the VXLAN encapsulation.
    #[arg(long, env = "FLOCK_CNI_MTU")]
    cni_mtu: Option<u32>,
    /// Pods' hostPorts: auto chains the portmap plugin after flock-cni when it is in
    /// --cni-bin-dir; on always (a pod's ADD then fails without it); off never (hostPorts
    /// are not served).
    #[arg(long, env = "FLOCK_CNI_HOST_PORTS", value_enum, default_value_t = HostPortsArg::Auto)]
    cni_host_ports: HostPortsArg,
    /// Directory of the node's CNI plugins (where --cni-host-ports auto looks for portmap).
    #[arg(long, env = "FLOCK_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// Do not isolate the egress of pods labelled flock.dev/run that no policy selects yet.
    #[arg(long, env = "FLOCK_NO_RUN_POD_ISOLATION")]
    no_run_pod_isolation: bool,
    /// Do not program routes to other nodes' pod CIDRs (another component routes).
    #[arg(long, env = "FLOCK_NO_ROUTES")]
    no_routes: bool,
    /// How other nodes' pods are reached: host-gw (via the node's InternalIP: one L2
    /// segment), vxlan (an overlay to every node) or auto (host-gw where the node is on-link,
    /// VXLAN elsewhere).
    #[arg(long, env = "FLOCK_ROUTING", default_value = "host-gw")]
    routing: flock::agent::routes::Routing,
    /// The overlay's VXLAN network identifier.
    #[arg(long, env = "FLOCK_VXLAN_VNI", default_value_t = flock::agent::routes::VxlanConfig::default().vni)]
    vxlan_vni: u32,
    /// The overlay's UDP port.
    #[arg(long, env = "FLOCK_VXLAN_PORT", default_value_t = flock::agent::routes::VxlanConfig::default().port)]
    vxlan_port: u16,
    /// The overlay's device over an IPv4 underlay (over IPv6: this and `6`).
    #[arg(long, env = "FLOCK_VXLAN_DEVICE", default_value_t = flock::agent::routes::VxlanConfig::default().device)]
    vxlan_device: String,
    /// A watch (or, while the watches are quiet, the API probe) failing this long makes the
    /// API health Degraded.
    #[arg(long, env = "FLOCK_DEGRADED_AFTER", default_value = "5s", value_parser = parse_duration)]
    degraded_after: Duration,
    /// A watch (or the API probe) failing this long makes the API health Disconnected.
    #[arg(long, env = "FLOCK_DISCONNECTED_AFTER", default_value = "60s", value_parser = parse_duration)]
    disconnected_after: Duration,
    /// Do not publish Kubernetes Events for policies flock cannot enforce as written (nor
    /// campaign for the reporter Lease); flock_policy_problems_cluster is kept either way.
    #[arg(long, env = "FLOCK_NO_EVENTS")]
    no_events: bool,
    /// Name of the Lease whose holder, one agent in the cluster, publishes those Events.
    #[arg(long, env = "FLOCK_REPORTER_LEASE", default_value = "flock-agent-reporter")]
    reporter_lease: String,
    /// Namespace of that Lease (from the downward API: this pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flock-system")]
    reporter_lease_namespace: String,
    /// The nft binary.
    #[arg(long, env = "FLOCK_NFT", default_value = "nft")]
    nft: PathBuf,
    /// Write every nftables transaction through the nft binary instead of as nf_tables
    /// netlink batches, and read the table back for the drift check through it too (a way
    /// back should a kernel refuse the batches; slower).
    #[arg(long, env = "FLOCK_NFT_TRANSACTIONS")]
    nft_transactions: bool,
    /// NFLOG group the kernel logs denied packets to, which the agent reads (structured log
    /// target flock::denied, metric flock_denied_packets_total). 0: do not log denials.
    #[arg(long, env = "FLOCK_DENY_LOG_GROUP", default_value_t = 100)]
    deny_log_group: u16,
    /// Denials logged per second per pod and direction, after the burst.
    #[arg(long, env = "FLOCK_DENY_LOG_RATE", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    deny_log_rate: u32,
    /// Denials logged at once per pod and direction before the rate applies.
    #[arg(long, env = "FLOCK_DENY_LOG_BURST", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    deny_log_burst: u32,
    /// Honour flock.dev/enforcement: audit on NetworkPolicies, namespaces and
    /// ClusterNetworkPolicies: such policies are evaluated and what they would deny is
    /// logged (flock::denied, audit=true; flock_audit_denials_total) and accepted. Audit
    /// means open: off by default, and never for sandboxed runs' pods and policies. Needs
    /// the denial log (--deny-log-group not 0).
    #[arg(long, env = "FLOCK_ALLOW_AUDIT_MODE")]
    allow_audit_mode: bool,
    /// After every change, cut the established connections the policy in force denies: the
    /// agent marks them in conntrack and the ruleset stops their packets both ways (a TCP
    /// end that sends gets a reset). Log target flock::revoked, metric
    /// flock_revoked_connections_total. false: a connection admitted before a change lives
    /// on until it ends.
    #[arg(long, env = "FLOCK_REVOKE_DENIED_FLOWS", default_value_t = true, action = clap::ArgAction::Set)]
    revoke_denied_flows: bool,
    /// The ct mark bit flock owns for revoked connections (one bit; other agents' bits of
    /// the ct mark are left alone).
    #[arg(long, env = "FLOCK_REVOKE_CT_MARK", default_value = "0x01000000", value_parser = parse_mark_bit)]
    revoke_ct_mark: u32,
    /// Keep this node's FlockNode (flock.dev/v1alpha1, named after the node) current: what
    /// the agent enforces here (version, API state, ruleset hash and size, last sync error,
    /// the NetworkPolicies of this node's run pods with their generations).
    #[arg(long, env = "FLOCK_NODE_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    node_status: bool,
    /// At most one write of the FlockNode's status per this long (writes happen only when it
    /// changes).
    #[arg(long, env = "FLOCK_NODE_STATUS_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    node_status_interval: Duration,
    /// Run the DNS proxy that enforces domain rules (ClusterNetworkPolicy domainNames, the
    /// flock.dev/egress-domains annotation): a pod with one has its DNS to the trusted
    /// resolvers judged by its egress policy, then answered through the proxy, which admits
    /// each answer's addresses (until their TTL) before the pod sees it. false: domain rules
    /// admit nothing (fail closed).
    #[arg(long, env = "FLOCK_DNS_PROXY", default_value_t = true, action = clap::ArgAction::Set)]
    dns_proxy: bool,
    /// The trusted resolvers: pods as `namespace/label=value[,label=value]` (`*/…`: any
    /// namespace), by default the cluster DNS Service's endpoints in most clusters.
    #[arg(long, env = "FLOCK_DNS_RESOLVER_PODS", default_value_t = flock::translate::ResolverPods::cluster_dns(), value_parser = parse_resolver_pods)]
    dns_resolver_pods: flock::translate::ResolverPods,
    /// More trusted resolvers, comma-separated addresses as pods reach them after the DNS
    /// Service's DNAT (not the Service's own address).
    #[arg(long, env = "FLOCK_DNS_RESOLVERS", value_delimiter = ',')]
    dns_resolvers: Vec<std::net::IpAddr>,
    /// The DNS proxy's port, on 127.0.0.1 and ::1 of the node (tproxy delivers steered DNS
    /// there, addresses kept; no pod can address it).
    #[arg(long, env = "FLOCK_DNS_PROXY_PORT", default_value_t = flock::dns_proxy::DEFAULT_PROXY_PORT)]
    dns_proxy_port: u16,
    /// The packet mark bit of DNS on its way to the proxy (one bit; routed to the node by an
    /// ip rule on it).
    #[arg(long, env = "FLOCK_DNS_PROXY_MARK", default_value = "0x00000080", value_parser = parse_mark_bit)]
    dns_proxy_mark: u32,
    /// The routing table (and the priority of its ip rule) that delivers marked DNS to the
    /// node itself.
    #[arg(long, env = "FLOCK_DNS_ROUTE_TABLE", default_value_t = flock::dns_proxy::DEFAULT_ROUTE_TABLE)]
    dns_route_table: u32,
    /// Priority of the `ip rule` that sends marked DNS to that table.
    #[arg(long, env = "FLOCK_DNS_RULE_PRIORITY", default_value_t = flock::dns_proxy::DEFAULT_RULE_PRIORITY)]
    dns_rule_priority: u32,
    /// A learned address is admitted for at least this long (a shorter TTL is raised to it).
    #[arg(long, env = "FLOCK_DNS_MIN_TTL", default_value = "30s", value_parser = parse_duration)]
    dns_min_ttl: Duration,
    /// A learned address is admitted for at most this long (a longer TTL is cut to it).
    #[arg(long, env = "FLOCK_DNS_MAX_TTL", default_value = "1h", value_parser = parse_duration)]
    dns_max_ttl: Duration,
    /// How long the DNS proxy waits for a resolver's answer.
    #[arg(long, env = "FLOCK_DNS_UPSTREAM_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    dns_upstream_timeout: Duration,
    /// UDP queries the DNS proxy has in flight at most, per pod and on the node (beyond:
    /// dropped and counted; the pod's resolver asks again).
    #[arg(long, env = "FLOCK_DNS_IN_FLIGHT_PER_POD", default_value_t = flock::dns_proxy::proxy::Bounds::default().in_flight_per_pod)]
    dns_in_flight_per_pod: usize,
    /// Queries the DNS proxy has upstream at once on the node (beyond: dropped and counted).
    #[arg(long, env = "FLOCK_DNS_IN_FLIGHT", default_value_t = flock::dns_proxy::proxy::Bounds::default().in_flight)]
    dns_in_flight: usize,
    /// TCP connections the DNS proxy takes at most, per pod and on the node (beyond: closed).
    #[arg(long, env = "FLOCK_DNS_TCP_PER_POD", default_value_t = flock::dns_proxy::proxy::Bounds::default().tcp_per_pod)]
    dns_tcp_per_pod: usize,
    /// TCP connections the DNS proxy takes at most on the node (beyond: closed).
    #[arg(long, env = "FLOCK_DNS_TCP", default_value_t = flock::dns_proxy::proxy::Bounds::default().tcp)]
    dns_tcp: usize,
    /// A pod's TCP connection to the DNS proxy with no complete query for this long is closed.
    #[arg(long, env = "FLOCK_DNS_TCP_IDLE", default_value = "10s", value_parser = parse_duration)]
    dns_tcp_idle: Duration,
    /// The DNS proxy asks names with their letters in a random case (DNS 0x20) and takes
    /// only answers that echo it; false for resolvers that do not keep the case.
    #[arg(long, env = "FLOCK_DNS_RANDOMIZE_CASE", default_value_t = true, action = clap::ArgAction::Set)]
    dns_randomize_case: bool,
    /// Learned addresses a domain rule's set (per family), and the node, holds at most;
    /// beyond, the addresses that expire first are evicted.
    #[arg(long, env = "FLOCK_DNS_LEARNED_PER_SET", default_value_t = flock::dns_proxy::learner::LearnedBounds::default().per_set)]
    dns_learned_per_set: usize,
    /// Learned addresses held at most in all domain sets of the node; beyond, the addresses
    /// that expire first are evicted.
    #[arg(long, env = "FLOCK_DNS_LEARNED_PER_NODE", default_value_t = flock::dns_proxy::learner::LearnedBounds::default().per_node)]
    dns_learned_per_node: usize,
    /// The socket of flock-socket-keeper, which holds the DNS proxy's listeners across the
    /// agent's restarts and upgrades (queries wait in them for the next agent instead of
    /// being dropped). Unset: the listeners close with the agent.
    #[arg(long, env = "FLOCK_DNS_SOCKET_KEEPER")]
    dns_socket_keeper: Option<PathBuf>,
    /// The DaemonSet that runs this agent (in its namespace, POD_NAMESPACE). When it or the
    /// namespace is deleted (helm uninstall, kubectl delete), the agent removes flock from the
    /// node as it stops: table, routes, devices, and the CNI config once no flock pod is left
    /// (docs/install.md#stopping-and-removing). Unset: every stop is a restart and the rules
    /// stay.
    #[arg(long, env = "FLOCK_DAEMONSET")]
    daemonset: Option<String>,
    /// Where every pod's identity comes from: pods watches every Pod in the cluster; slices
    /// reads flock-controller's PodSlices (flock-controller --pod-slices) and watches only
    /// this node's Pods.
    #[arg(long, env = "FLOCK_POD_SOURCE", value_enum, default_value_t = PodSourceArg::Pods)]
    pod_source: PodSourceArg,
    /// With --pod-source slices: the PodSlices' writer's leader Lease (flock-controller's, in
    /// POD_NAMESPACE), read every 30-45 s to report the writer's absence.
    #[arg(long, env = "FLOCK_POD_SLICE_WRITER_LEASE", default_value = "flock-controller")]
    pod_slice_writer_lease: String,
    /// This pod's name (the reporter Lease's holder identity, Events' reporting instance).
    #[arg(long, env = "POD_NAME", default_value = "flock-agent")]
    pod_name: String,
    /// This pod's uid (from the downward API), written into the FlockNode with its name and
    /// namespace: `flockctl status` tells a status the running agent wrote from an older one.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
}

/// One bit of the ct mark, as `0x…` or decimal.
fn parse_mark_bit(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))?;
    if v.count_ones() != 1 {
        return Err(format!("{s:?}: one bit of the mark (e.g. 0x01000000), not {v:#x}"));
    }
    Ok(v)
}

/// `namespace/label=value[,label=value]`, `*/…` for every namespace.
fn parse_resolver_pods(s: &str) -> Result<flock::translate::ResolverPods, String> {
    let (ns, labels) = s.split_once('/').ok_or_else(|| format!("{s:?}: namespace/label=value[,label=value]"))?;
    let mut out = std::collections::BTreeMap::new();
    for kv in labels.split(',') {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{s:?}: {kv:?} is not label=value"))?;
        if k.is_empty() {
            return Err(format!("{s:?}: an empty label name"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    if ns.is_empty() {
        return Err(format!("{s:?}: a namespace (or *) is required"));
    }
    Ok(flock::translate::ResolverPods { namespace: (ns != "*").then(|| ns.to_string()), labels: out })
}

/// A duration of at least one second (a rate limit of the API server's writes).
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?}: at least 1s"));
    }
    Ok(d)
}

/// A duration as `humantime` reads it (`30s`, `500ms`, `1m 30s`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?}: {e} (a duration like 30s, 500ms, 1m 30s)"))
}

/// How this node's FlockNode is written (`None`: not at all).
fn node_status_options(args: &Args) -> Option<NodeStatusOptions> {
    let agent_pod = args
        .pod_uid
        .as_ref()
        .filter(|uid| !uid.is_empty())
        .map(|uid| AgentPod { name: format!("{}/{}", args.reporter_lease_namespace, args.pod_name), uid: uid.clone() });
    args.node_status.then(|| NodeStatusOptions { agent_pod, interval: args.node_status_interval, ..NodeStatusOptions::default() })
}

/// `--pod-source`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PodSourceArg {
    Pods,
    Slices,
}

/// `--cni-host-ports`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum HostPortsArg {
    Auto,
    On,
    Off,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args.log, args.log_format);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("flock-agent failed: {}", flock::process::error_chain(&*e));
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.allow_audit_mode && args.deny_log_group == 0 {
        anyhow::bail!(
            "--allow-audit-mode needs the denial log (--deny-log-group is 0): audited policies would be neither enforced nor logged"
        );
    }
    if args.revoke_ct_mark == flock::render::DOMAIN_MARK {
        anyhow::bail!("--revoke-ct-mark {:#x} is the ct mark bit domain rules use", args.revoke_ct_mark);
    }
    if args.routing != flock::agent::routes::Routing::HostGw {
        let v = flock::agent::routes::VxlanConfig { vni: args.vxlan_vni, port: args.vxlan_port, device: args.vxlan_device.clone() };
        v.check().map_err(|e| anyhow::anyhow!("--routing {}: {e}", args.routing))?;
    }
    if args.dns_min_ttl > args.dns_max_ttl {
        anyhow::bail!("--dns-min-ttl is above --dns-max-ttl");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let config = kube::Config::infer().await.context("building the Kubernetes client (in-cluster config or KUBECONFIG)")?;
        let client = kube::Client::try_from(config.clone()).context("building the Kubernetes client")?;
        let mut agent = AgentConfig::new(&args.node_name, Netns::Current, args.socket.clone(), args.pending_del_dir.clone());
        agent.state_dir = Some(args.state_dir.clone());
        agent.resync = args.resync_period;
        agent.pod_wait = args.pod_wait;
        agent.routes = !args.no_routes;
        agent.routing = flock::agent::routes::RoutingConfig {
            routing: args.routing,
            vxlan: flock::agent::routes::VxlanConfig { vni: args.vxlan_vni, port: args.vxlan_port, device: args.vxlan_device.clone() },
        };
        agent.translate.isolate_run_pods = !args.no_run_pod_isolation;
        agent.translate.audit_mode = args.allow_audit_mode;
        agent.nft = args.nft.clone();
        agent.nft_transactions = args.nft_transactions;
        agent.revoke = args.revoke_denied_flows.then_some(args.revoke_ct_mark);
        if args.dns_proxy {
            agent.translate.dns_resolvers = Some(args.dns_resolver_pods.clone());
            let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
            agent.dns = Some(flock::dns_proxy::DnsConfig {
                port: args.dns_proxy_port,
                mark: args.dns_proxy_mark,
                route_table: args.dns_route_table,
                rule_priority: args.dns_rule_priority,
                resolvers: args.dns_resolvers.clone(),
                limits: flock::dns::Limits {
                    min_ttl: secs(args.dns_min_ttl),
                    max_ttl: secs(args.dns_max_ttl),
                    ..flock::dns::Limits::default()
                },
                upstream_timeout: args.dns_upstream_timeout,
                bounds: flock::dns_proxy::proxy::Bounds {
                    in_flight_per_pod: args.dns_in_flight_per_pod,
                    in_flight: args.dns_in_flight,
                    tcp_per_pod: args.dns_tcp_per_pod,
                    tcp: args.dns_tcp,
                    tcp_idle: args.dns_tcp_idle,
                    ..flock::dns_proxy::proxy::Bounds::default()
                },
                randomize_case: args.dns_randomize_case,
                keeper: args.dns_socket_keeper.clone().filter(|p| !p.as_os_str().is_empty()),
                learned: flock::dns_proxy::learner::LearnedBounds {
                    per_set: args.dns_learned_per_set,
                    per_node: args.dns_learned_per_node,
                },
            });
        }
        agent.deny_log = (args.deny_log_group != 0).then_some(flock::render::log::DenyLog {
            group: args.deny_log_group,
            rate: args.deny_log_rate,
            burst: args.deny_log_burst,
        });
        let opts = DaemonOptions {
            agent,
            listen: args.metrics_address.clone(),
            cni_conf: (!args.no_cni_conf).then(|| (args.cni_conf_dir.clone(), args.cni_conf_name.clone())),
            cni_mtu: args.cni_mtu,
            cni_host_ports: match args.cni_host_ports {
                HostPortsArg::Auto => HostPorts::Auto(args.cni_bin_dir.clone()),
                HostPortsArg::On => HostPorts::On,
                HostPortsArg::Off => HostPorts::Off,
            },
            degraded_after: args.degraded_after,
            disconnected_after: args.disconnected_after,
            source: SourceOptions {
                pods: match args.pod_source {
                    PodSourceArg::Pods => PodSource::Pods,
                    PodSourceArg::Slices => PodSource::Slices {
                        node: args.node_name.clone(),
                        writer: WriterLease {
                            namespace: args.reporter_lease_namespace.clone(),
                            name: args.pod_slice_writer_lease.clone(),
                            ..WriterLease::default()
                        },
                    },
                },
                ..SourceOptions::for_node(&args.node_name)
            },
            events: !args.no_events,
            instance: args.pod_name.clone(),
            report: ReportOptions {
                lease: LeaseSettings {
                    namespace: args.reporter_lease_namespace.clone(),
                    name: args.reporter_lease.clone(),
                    ..reporter_lease()
                },
                ..ReportOptions::default()
            },
            max_sync_age: args.resync_period * 3,
            node_status: node_status_options(&args),
            removal: args.daemonset.clone().filter(|d| !d.is_empty()).map(|daemonset| flock::removal::RemovalOptions {
                namespace: args.reporter_lease_namespace.clone(),
                daemonset,
                cni_bin_dir: args.cni_bin_dir.clone(),
            }),
        };
        let stop = stop_on_signals("rules");
        tracing::info!(node = %args.node_name, "flock-agent starting");
        // The informers build their own client on their own thread (see `daemon::run`).
        daemon::run(opts, client, move || kube::Client::try_from(config), stop).await.context("running the agent")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_pods_and_mark_bits() {
        let p = parse_resolver_pods("kube-system/k8s-app=kube-dns").unwrap();
        assert_eq!(p.namespace.as_deref(), Some("kube-system"));
        assert_eq!(p.labels.get("k8s-app").map(String::as_str), Some("kube-dns"));
        assert_eq!(p, flock::translate::ResolverPods::cluster_dns());
        let p = parse_resolver_pods("*/app=dns,tier=infra").unwrap();
        // What they print (the flag's default in --help, messages) reads back as the same.
        assert_eq!(p.to_string(), "*/app=dns,tier=infra");
        assert_eq!(parse_resolver_pods(&p.to_string()), Ok(p.clone()));
        assert_eq!((p.namespace, p.labels.len()), (None, 2));
        for bad in ["kube-dns", "/a=b", "ns/a", "ns/=b"] {
            assert!(parse_resolver_pods(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_mark_bit("0x00000080"), Ok(0x80));
        assert_eq!(parse_mark_bit("16777216"), Ok(0x0100_0000));
        for bad in ["0x3", "0", "0xzz", "-1"] {
            assert!(parse_mark_bit(bad).is_err(), "{bad}");
        }
        // The defaults parse, and the proxy runs by default.
        let args = Args::try_parse_from(["flock-agent", "--node-name", "n"]).unwrap();
        assert!(args.dns_proxy && args.dns_resolvers.is_empty());
        assert_eq!((args.dns_proxy_port, args.dns_proxy_mark, args.dns_route_table), (15053, 0x80, 180));
        assert_eq!((args.dns_rule_priority, args.dns_resolver_pods.to_string().as_str()), (90, "kube-system/k8s-app=kube-dns"));
        assert_eq!((args.dns_min_ttl, args.dns_max_ttl), (Duration::from_secs(30), Duration::from_secs(3600)));
        assert_eq!((args.dns_upstream_timeout, args.dns_tcp_idle), (Duration::from_secs(5), Duration::from_secs(10)));
        assert_eq!((args.dns_in_flight_per_pod, args.dns_in_flight, args.dns_tcp_per_pod, args.dns_tcp), (32, 256, 4, 64));
        assert!(args.dns_randomize_case);
        assert_eq!((args.dns_learned_per_set, args.dns_learned_per_node), (2048, 16_384));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("soon").is_err());
        // A unit is required: "5" could mean seconds or milliseconds.
        assert!(parse_duration("5").is_err());
        assert_eq!(parse_interval("10s").unwrap(), Duration::from_secs(10));
        assert!(parse_interval("0s").is_err() && parse_interval("500ms").is_err());
    }

    #[test]
    fn the_flocknode_is_written_at_most_every_10_seconds_by_default() {
        // docs/reference.md says 10 s; the flag and NodeStatusOptions::default must agree.
        let args = Args::try_parse_from(["flock-agent", "--node-name", "n1"]).unwrap();
        assert_eq!(args.node_status_interval, Duration::from_secs(10));
        assert_eq!(node_status_options(&args), Some(NodeStatusOptions::default()));
        let off = Args::try_parse_from(["flock-agent", "--node-name", "n1", "--node-status", "false"]).unwrap();
        assert_eq!(node_status_options(&off), None);
    }

    #[test]
    fn flags_have_environment_fallbacks() {
        use clap::CommandFactory;
        let cmd = Args::command();
        for arg in cmd.get_arguments().filter(|a| a.get_id() != "help" && a.get_id() != "version") {
            assert!(arg.get_env().is_some(), "--{} has no environment fallback", arg.get_id());
        }
    }
}
