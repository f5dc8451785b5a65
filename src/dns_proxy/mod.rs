//! Egress by domain name on the node, apart from the agent's sync loop as netavark keeps its
//! DNS server apart: the transparent proxy ([`proxy`]), what it learns written into the domain
//! rules' timed sets ([`learner`]), the socket keeper that holds its listeners across agent
//! restarts ([`keeper`]), and here the service that runs them in the node's namespace with the
//! policy routing that delivers steered DNS to it. The agent ([`crate::agent`]) starts the
//! service and hands it the domain rules after every committed sync; nothing here reads the
//! agent's state (its metrics come in behind [`learner::LearnedStats`] and
//! [`proxy::ProxyStats`]). The pure parts (names, answers, exchanges) are [`crate::dns`].
//!
//! Order (the listener is ready before any redirect exists): [`DnsService::start`] binds the
//! proxy's transparent sockets and adds the routing rule before the agent's first sync; the
//! sync loop renders the steering chains ([`crate::render::DnsSteer`]) and, once a sync is
//! committed, hands the domain rules of what it committed to the learner
//! ([`DnsService::set_rules`]). If the proxy stops, steered DNS is dropped by the rendered
//! table (fail closed). The trusted resolvers the translation found are remembered in the
//! agent's state directory ([`RESOLVERS_FILE`]): a restarted agent whose API server does not
//! answer yet keeps serving the DNS its table (which outlives it) steers to the proxy.

pub mod keeper;
pub mod learner;
pub mod proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use rtnetlink::packet_route::route::{RouteScope, RouteType};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute};
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio::sync::watch;

use crate::netns::{self, Netns};
use crate::render::{self, DnsSteer};
use crate::translate::NodePolicy;
use keeper::Keeper;
use learner::{DomainLearner, DomainRule, KernelWriter, LearnedStats};
use proxy::{DnsProxy, Listeners, ProxyConfig, ProxyError, ProxyStats};

/// flock-agent's defaults (`--dns-proxy-port`, `--dns-route-table`, `--dns-rule-priority`),
/// which the simulation's agents use too.
pub const DEFAULT_PROXY_PORT: u16 = 15053;
pub const DEFAULT_ROUTE_TABLE: u32 = 180;
pub const DEFAULT_RULE_PRIORITY: u32 = 90;

/// What the agent's DNS proxy is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// The proxy's port (transparent: any address of the node).
    pub port: u16,
    /// The packet mark bit of steered DNS (one bit).
    pub mark: u32,
    /// The routing table that delivers marked packets to the node itself, and the priority
    /// of the rule that chooses it.
    pub route_table: u32,
    pub rule_priority: u32,
    /// Trusted resolvers, as pods reach them after the Service's DNAT, besides the resolver
    /// pods the translation selects (`translate::Options::dns_resolvers`).
    pub resolvers: Vec<IpAddr>,
    /// TTL floor and cap, addresses per answer, CNAME steps.
    pub limits: crate::dns::Limits,
    pub upstream_timeout: Duration,
    /// What pods may hold of the proxy (queries in flight, TCP connections).
    pub bounds: proxy::Bounds,
    /// Asked names go upstream in a random case (DNS 0x20).
    pub randomize_case: bool,
    /// Learned addresses per domain rule's set and per node.
    pub learned: learner::LearnedBounds,
    /// The socket keeper ([`super::keeper`]) that holds the proxy's listeners across the
    /// agent's restarts; `None`: they close with the agent.
    pub keeper: Option<PathBuf>,
}

impl Default for DnsConfig {
    /// flock-agent's defaults.
    fn default() -> Self {
        Self {
            port: DEFAULT_PROXY_PORT,
            mark: render::DNS_MARK,
            route_table: DEFAULT_ROUTE_TABLE,
            rule_priority: DEFAULT_RULE_PRIORITY,
            resolvers: Vec::new(),
            limits: crate::dns::Limits::default(),
            upstream_timeout: Duration::from_secs(5),
            bounds: proxy::Bounds::default(),
            randomize_case: true,
            learned: learner::LearnedBounds::default(),
            keeper: None,
        }
    }
}

impl DnsConfig {
    /// The steering the renderer writes for this proxy.
    /// The steering the rendered table needs for this proxy.
    pub fn steer(&self) -> DnsSteer {
        DnsSteer::new(self.port, self.mark, self.resolvers.iter().map(|a| ipnet::IpNet::from(*a)).collect())
    }
}

/// Why the DNS proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("DNS proxy in {netns}: {error}")]
    Proxy { netns: String, error: ProxyError },
    #[error("DNS proxy in {netns}: policy routing for mark {mark:#x} (table {table}): {message}")]
    Routing { netns: String, mark: u32, table: u32, message: String },
    #[error("DNS proxy in {netns}: {message}")]
    Thread { netns: String, message: String },
}

/// The file in the agent's state directory that remembers the trusted resolvers the last
/// committed translation found.
pub(crate) const RESOLVERS_FILE: &str = "dns-resolvers";

/// The running proxy.
pub(crate) struct DnsService {
    learner: Arc<DomainLearner<KernelWriter>>,
    trusted: proxy::Trusted,
    /// Trusted whatever the translation finds.
    configured: Vec<IpAddr>,
    /// Where the trusted resolvers are remembered across restarts, and what was written last.
    remembered: Option<(PathBuf, std::sync::Mutex<BTreeSet<IpAddr>>)>,
    /// Turns true with the first domain rules: the proxy reads queries only then (or after
    /// [`RULES_WAIT`]).
    ruled: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long the proxy leaves queries waiting for the first committed sync's domain rules. An
/// answer served before them teaches nothing (its addresses stay closed to the pod), so after
/// a restart the queries that waited for the new agent wait a little longer, for its first
/// sync; an agent whose API server does not answer serves them after this, admitting only
/// what its table still holds from before.
pub const RULES_WAIT: Duration = Duration::from_secs(3);

/// How often the agent hands its listeners to the socket keeper again (a keeper that
/// restarted holds nothing until then).
const KEEP_PERIOD: Duration = Duration::from_secs(10);

/// The proxy's listeners: the ones a previous agent left with the socket keeper (the
/// queries that arrived meanwhile waiting in them) when they fit `config`, else new ones.
fn listeners(config: &ProxyConfig, keeper: Option<&Keeper>) -> Result<Listeners, ProxyError> {
    if let Some(k) = keeper {
        let at = k.path().display();
        match k.take(keeper::DNS_PROXY) {
            Ok(fds) if fds.is_empty() => tracing::info!(keeper = %at, "DNS proxy: the socket keeper holds no listeners yet; binding them"),
            Ok(fds) => match Listeners::adopt(config, fds) {
                Ok(l) => {
                    tracing::info!(keeper = %at, "DNS proxy: took over the listeners the previous agent left with the socket keeper");
                    return Ok(l);
                }
                Err(why) => {
                    tracing::warn!(keeper = %at, why, "DNS proxy: the socket keeper's listeners do not fit this configuration; binding new ones");
                    // They hold the addresses the new ones bind.
                    if let Err(e) = k.deposit(keeper::DNS_PROXY, &[]) {
                        tracing::warn!(error = %e, "DNS proxy: cannot clear the socket keeper's listeners");
                    }
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "DNS proxy: no listeners from the socket keeper; binding them (DNS is dropped while the agent restarts)")
            }
        }
    }
    // Addresses in use: a socket keeper holds listeners this agent did not take (it does not
    // use the keeper, or could not reach it). Cleared when the keeper is ours; else the
    // keeper lets them go within its expiry, which this waits out.
    let deadline = std::time::Instant::now() + keeper::EXPIRY + Duration::from_secs(30);
    let mut said = false;
    loop {
        match Listeners::bind(config) {
            Err(ProxyError::Listen { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline =>
            {
                if !said {
                    tracing::warn!(
                        port = config.port,
                        "DNS proxy: its addresses are in use (a socket keeper this agent does not use still holds a previous agent's listeners?); waiting for them"
                    );
                    said = true;
                }
                if let Some(k) = keeper {
                    let _ = k.deposit(keeper::DNS_PROXY, &[]);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Hands the listeners' descriptors to the keeper now and every [`KEEP_PERIOD`] until `stop`;
/// says when that starts or stops working.
async fn keep(keeper: Keeper, fds: Vec<std::os::fd::OwnedFd>, mut stop: watch::Receiver<bool>) {
    let fds = Arc::new(fds);
    let mut held = None;
    loop {
        let (k, f) = (keeper.clone(), fds.clone());
        let deposited = tokio::task::spawn_blocking(move || {
            let borrowed: Vec<_> = f.iter().map(std::os::fd::AsFd::as_fd).collect();
            k.deposit(keeper::DNS_PROXY, &borrowed)
        })
        .await;
        match deposited {
            Ok(Ok(())) if held != Some(true) => {
                tracing::info!(keeper = %keeper.path().display(), "DNS proxy: the socket keeper holds the listeners (DNS waits, not drops, while the agent restarts)");
                held = Some(true);
            }
            Ok(Err(e)) if held != Some(false) => {
                tracing::warn!(error = %e, "DNS proxy: the socket keeper does not hold the listeners (DNS is dropped while the agent restarts); trying again every {}s", KEEP_PERIOD.as_secs());
                held = Some(false);
            }
            _ => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(KEEP_PERIOD) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The trusted resolvers remembered in `path` (one address per line); none when there is no
/// such file, and what parses when it is damaged (a bad line is skipped and logged).
fn read_remembered(path: &Path) -> BTreeSet<IpAddr> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeSet::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the remembered DNS resolvers cannot be read");
            return BTreeSet::new();
        }
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match l.trim().parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                tracing::warn!(path = %path.display(), line = %crate::model::clip(l), "a remembered DNS resolver that is no address, skipped");
                None
            }
        })
        .collect()
}

/// Writes `addrs` to `path` whole or not at all (a temporary file renamed over it).
fn write_remembered(path: &Path, addrs: &BTreeSet<IpAddr>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let text: String = addrs.iter().map(|a| format!("{a}\n")).collect();
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl DnsService {
    /// Binds the proxy in `ns`, adds its policy routing there, and serves until dropped.
    /// `remembered`: where the trusted resolvers the translation found are remembered, so that
    /// after a restart, while the API does not answer yet, the proxy still serves the pods the
    /// table (which outlives the agent) steers to it.
    pub(crate) fn start(
        config: &DnsConfig,
        ns: &Netns,
        stats: Arc<ProxyStats>,
        learned: Arc<dyn LearnedStats>,
        remembered: Option<PathBuf>,
    ) -> Result<Self, DnsError> {
        let learner = Arc::new(DomainLearner::new(KernelWriter::default()).with_bounds(config.learned).with_metrics(learned));
        let mut proxy_config = ProxyConfig::new(config.port, config.resolvers.clone());
        proxy_config.limits = config.limits;
        proxy_config.upstream_timeout = config.upstream_timeout;
        proxy_config.bounds = config.bounds;
        proxy_config.randomize_case = config.randomize_case;
        let proxy = DnsProxy::with_stats(proxy_config, learner.clone(), stats);
        let trusted = proxy.trusted();
        let remembered = remembered.map(|path| {
            let addrs = read_remembered(&path);
            if !addrs.is_empty() {
                tracing::info!(resolvers = ?addrs, "DNS proxy: trusting the resolvers the last run found until the first sync");
            }
            trusted.set(config.resolvers.iter().copied().chain(addrs.iter().copied()).collect());
            (path, std::sync::Mutex::new(addrs))
        });
        let (stop, stop_rx) = watch::channel(false);
        let (ruled, mut ruled_rx) = watch::channel(false);
        let keeper = config.keeper.clone().map(Keeper::new);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), DnsError>>();
        let (thread_ns, routing) = (ns.clone(), config.clone());
        let desc = ns.describe();
        let thread = std::thread::Builder::new()
            .name("flock-dns-proxy".into())
            .spawn(move || {
                let fail = ready_tx.clone();
                let entered = netns::run_in(&thread_ns, move || {
                    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(DnsError::Thread { netns: desc.clone(), message: e.to_string() }));
                            return;
                        }
                    };
                    rt.block_on(async move {
                        let listeners = match listeners(proxy.config(), keeper.as_ref()) {
                            Ok(l) => l,
                            Err(error) => {
                                let _ = ready_tx.send(Err(DnsError::Proxy { netns: desc.clone(), error }));
                                return;
                            }
                        };
                        if let Err(message) = policy_routing(&routing).await {
                            let _ = ready_tx.send(Err(DnsError::Routing {
                                netns: desc.clone(),
                                mark: routing.mark,
                                table: routing.route_table,
                                message,
                            }));
                            return;
                        }
                        if let Some(k) = keeper {
                            match listeners.fds() {
                                Ok(fds) => drop(tokio::spawn(keep(k, fds, stop_rx.clone()))),
                                Err(e) => tracing::warn!(error = %e, "DNS proxy: cannot hand the listeners to the socket keeper"),
                            }
                        }
                        let _ = ready_tx.send(Ok(()));
                        let mut stop = stop_rx.clone();
                        tokio::select! {
                            _ = ruled_rx.wait_for(|r| *r) => {}
                            _ = tokio::time::sleep(RULES_WAIT) => {
                                tracing::warn!("DNS proxy: no committed sync yet; answering without domain rules (only what the table holds is admitted)");
                            }
                            _ = stop.wait_for(|s| *s) => return,
                        }
                        proxy.serve(listeners, stop_rx).await;
                    });
                });
                if let Err(e) = entered {
                    let _ = fail.send(Err(DnsError::Thread { netns: thread_ns.describe(), message: e.to_string() }));
                }
            })
            .map_err(|e| DnsError::Thread { netns: ns.describe(), message: e.to_string() })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {
                Ok(Self { learner, trusted, configured: config.resolvers.clone(), remembered, ruled, stop, thread: Some(thread) })
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(DnsError::Thread { netns: ns.describe(), message: "the proxy thread ended before it was ready".into() }),
        }
    }

    /// The domain rules and trusted resolvers of a committed translation, for the learner
    /// and the proxy.
    pub(crate) fn set_rules(&self, np: &NodePolicy) {
        self.trusted.set(self.configured.iter().chain(&np.dns_resolvers).copied().collect());
        self.learner.set_rules(domain_rules(np));
        self.ruled.send_replace(true);
        if let Some((path, last)) = &self.remembered {
            let found: BTreeSet<IpAddr> = np.dns_resolvers.iter().copied().collect();
            let mut last = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last != found {
                match write_remembered(path, &found) {
                    Ok(()) => *last = found,
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "the trusted DNS resolvers cannot be remembered"),
                }
            }
        }
    }
}

impl Drop for DnsService {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One learner rule per domain definition in use, for the local pods whose egress has it.
pub fn domain_rules(np: &NodePolicy) -> Vec<DomainRule> {
    render::domain_uses(np)
        .into_iter()
        .map(|(def, u)| DomainRule {
            source: u.sources.into_iter().collect::<Vec<_>>().join(", "),
            pods: u.pods,
            patterns: def.patterns.clone(),
            set_v4: render::domain_set_name(def, false),
            set_v6: render::domain_set_name(def, true),
        })
        .collect()
}

/// `ip rule add fwmark MARK/MARK lookup TABLE` and `ip route add local default dev lo table
/// TABLE`, both families, idempotent (what an earlier run left is kept).
async fn policy_routing(config: &DnsConfig) -> Result<(), String> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let have = existing_rules(&handle).await?;
    for v6 in [false, true] {
        if !have.get(&v6).is_some_and(|rules| rules.contains(&(config.mark, config.route_table))) {
            let add = handle.rule().add().table_id(config.route_table).priority(config.rule_priority).action(RuleAction::ToTable);
            let added = if v6 {
                let mut add = add.v6().fw_mark(config.mark);
                add.message_mut().attributes.push(RuleAttribute::FwMask(config.mark));
                add.execute().await
            } else {
                let mut add = add.v4().fw_mark(config.mark);
                add.message_mut().attributes.push(RuleAttribute::FwMask(config.mark));
                add.execute().await
            };
            added.map_err(|e| format!("adding the rule: {e}"))?;
        }
        let route = if v6 {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(std::net::Ipv6Addr::UNSPECIFIED, 0)
                .kind(RouteType::Local)
                .scope(RouteScope::Host)
                .table_id(config.route_table)
                .output_interface(LOOPBACK)
                .build()
        } else {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(std::net::Ipv4Addr::UNSPECIFIED, 0)
                .kind(RouteType::Local)
                .scope(RouteScope::Host)
                .table_id(config.route_table)
                .output_interface(LOOPBACK)
                .build()
        };
        handle.route().add(route).replace().execute().await.map_err(|e| format!("adding the local route: {e}"))?;
    }
    Ok(())
}

/// Removes what [`policy_routing`] adds, in `ns`: the rules on `config`'s mark to its table
/// and the table's routes (flock is being removed from the node). Returns how many went.
pub async fn remove_policy_routing(ns: &Netns, config: &DnsConfig) -> Result<usize, DnsError> {
    let (ns, config) = (ns.clone(), config.clone());
    let err = {
        let (netns, mark, table) = (ns.describe(), config.mark, config.route_table);
        move |message: String| DnsError::Routing { netns: netns.clone(), mark, table, message }
    };
    let fail = err.clone();
    let joined = tokio::task::spawn_blocking(move || {
        netns::run_in(&ns, || -> Result<usize, String> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
                let task = tokio::spawn(conn);
                let removed = unroute(&handle, &config).await;
                task.abort();
                removed
            })
        })
    })
    .await;
    match joined {
        Ok(Ok(r)) => r.map_err(err),
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(e) => Err(fail(e.to_string())),
    }
}

async fn unroute(handle: &Handle, config: &DnsConfig) -> Result<usize, String> {
    let mut n = 0;
    for version in [rtnetlink::IpVersion::V4, rtnetlink::IpVersion::V6] {
        let mut found = Vec::new();
        let mut rules = handle.rule().get(version).execute();
        while let Some(m) = rules.try_next().await.map_err(|e| format!("listing rules: {e}"))? {
            let table = m.attributes.iter().find_map(|a| if let RuleAttribute::Table(t) = a { Some(*t) } else { None });
            let mark = m.attributes.iter().find_map(|a| if let RuleAttribute::FwMark(v) = a { Some(*v) } else { None });
            if mark == Some(config.mark) && table.unwrap_or(u32::from(m.header.table)) == config.route_table {
                found.push(m);
            }
        }
        for m in found {
            handle.rule().del(m).execute().await.map_err(|e| format!("deleting the rule: {e}"))?;
            n += 1;
        }
    }
    for probe in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().table_id(config.route_table).build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().table_id(config.route_table).build(),
    ] {
        let mut found = Vec::new();
        let mut routes = handle.route().get(probe).execute();
        while let Some(m) = routes.try_next().await.map_err(|e| format!("listing routes: {e}"))? {
            let table = m
                .attributes
                .iter()
                .find_map(|a| if let rtnetlink::packet_route::route::RouteAttribute::Table(t) = a { Some(*t) } else { None });
            if table.unwrap_or(u32::from(m.header.table)) == config.route_table {
                found.push(m);
            }
        }
        for m in found {
            handle.route().del(m).execute().await.map_err(|e| format!("deleting a route of table {}: {e}", config.route_table))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The loopback interface's index (always 1).
const LOOPBACK: u32 = 1;

/// (fwmark, table) of the rules there, per family (`true`: IPv6).
async fn existing_rules(handle: &Handle) -> Result<BTreeMap<bool, Vec<(u32, u32)>>, String> {
    let mut out: BTreeMap<bool, Vec<(u32, u32)>> = BTreeMap::new();
    for (v6, version) in [(false, rtnetlink::IpVersion::V4), (true, rtnetlink::IpVersion::V6)] {
        let mut rules = handle.rule().get(version).execute();
        while let Some(m) = rules.try_next().await.map_err(|e| format!("listing rules: {e}"))? {
            let (mut mark, mut table) = (None, Some(u32::from(m.header.table)));
            for a in &m.attributes {
                match a {
                    RuleAttribute::FwMark(v) => mark = Some(*v),
                    RuleAttribute::Table(t) => table = Some(*t),
                    _ => {}
                }
            }
            if let (Some(mark), Some(table)) = (mark, table) {
                out.entry(v6).or_default().push((mark, table));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_resolvers_are_remembered_whole_and_read_back_failing_closed() {
        let dir = std::env::temp_dir().join(format!("flock-dns-remembered-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(RESOLVERS_FILE);
        assert!(read_remembered(&path).is_empty(), "no file: nothing remembered");
        let addrs: BTreeSet<IpAddr> = ["198.18.250.53".parse().unwrap(), "2001:db8:250::53".parse().unwrap()].into();
        write_remembered(&path, &addrs).unwrap();
        assert_eq!(read_remembered(&path), addrs);
        assert!(!path.with_extension("tmp").exists());
        // A damaged file: what parses counts, the rest is skipped (and logged).
        std::fs::write(&path, format!("198.18.250.53\nnot an address {}\n\n2001:db8:250::53\n", "x".repeat(10_000))).unwrap();
        assert_eq!(read_remembered(&path), addrs);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
