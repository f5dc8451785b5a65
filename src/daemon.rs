//! flock-agent, wired: the node agent core fed by the Kubernetes informer source, with the
//! health and metrics endpoints, the API health monitor, the CNI config writer, this node's
//! FlockNode ([`crate::report::node`]) and the cluster-wide report of policies flock cannot
//! enforce as written ([`crate::report`]). The binary only parses flags and builds the client;
//! tests run this with a client to the in-repo test API server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::watch;

use crate::agent::http::{self, HttpState, ListenAddr};
use crate::agent::metrics::Metrics;
use crate::agent::{Agent, AgentConfig, cniconf};
use crate::lease::LeaseError;
use crate::model::Snapshot;
use crate::removal::{Leftovers, RemovalOptions, RemovalWatch, Verdict};
use crate::report::node::{NodeStatusOptions, NodeStatusWriter};
use crate::report::{ReportOptions, Reporter};
use crate::source::SourceWriter;
use crate::source::kube::{ApiHealth, HealthState, SourceOptions};

/// How the daemon runs (the flags of `flock-agent`).
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub agent: AgentConfig,
    pub listen: ListenAddr,
    /// Write the CNI conflist here (directory, file name) once ready.
    pub cni_conf: Option<(PathBuf, String)>,
    pub cni_mtu: Option<u32>,
    /// Chain `portmap` for pods' hostPorts (`--cni-host-ports`).
    pub cni_host_ports: cniconf::HostPorts,
    pub degraded_after: Duration,
    pub disconnected_after: Duration,
    /// How the informers list, watch, back off and probe the API server.
    pub source: SourceOptions,
    /// Take part in reporting policies flock cannot enforce as written as Kubernetes Events
    /// (one agent in the cluster, holding a Lease, publishes them).
    pub events: bool,
    /// This agent (the pod name): the reporter Lease's holder identity, Events' reporting
    /// instance.
    pub instance: String,
    /// The reporter Lease and how Events are written.
    pub report: ReportOptions,
    /// `/healthz` fails when the last committed sync is older than this.
    pub max_sync_age: Duration,
    /// How this node's FlockNode is kept current (`None`: it is not written).
    pub node_status: Option<NodeStatusOptions>,
    /// The DaemonSet that runs the agent: when it (or its namespace) is deleted, the agent
    /// removes flock from the node as it stops ([`crate::removal`]). `None`: every stop is a
    /// restart and the rules stay.
    pub removal: Option<RemovalOptions>,
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot start the node agent: {0}")]
    Agent(crate::agent::StartError),
    #[error("{0}")]
    Source(crate::source::kube::SourceThreadError),
    #[error("cannot report policy problems: {0}")]
    Report(LeaseError),
    #[error("{0}")]
    Lock(crate::agent::node_lock::NodeLockError),
    /// A task of the agent panicked or ended: the process must exit so the kubelet restarts
    /// it (the rules stay in the kernel meanwhile).
    #[error("the node agent crashed: {0}")]
    Crashed(String),
}

/// Runs until `stop` turns true. Rules stay in the kernel afterwards. The informers run on a
/// thread of their own with the client `source_client` builds there
/// ([`crate::source::kube::spawn_thread`]); `client` serves the rest.
pub async fn run<C>(opts: DaemonOptions, client: Client, source_client: C, stop: watch::Receiver<bool>) -> Result<(), DaemonError>
where
    C: FnOnce() -> Result<Client, kube::Error> + Send + 'static,
{
    let metrics: Arc<Metrics> = opts.agent.metrics.clone();
    let reporter = Reporter::new(client.clone(), opts.report.clone(), &opts.instance, opts.events).map_err(DaemonError::Report)?;
    let health = Arc::new(ApiHealth::new(opts.degraded_after, opts.disconnected_after));
    let (writer, source) = SourceWriter::new(Snapshot::new(), false);
    let mut tasks = Vec::new();
    let informers =
        crate::source::kube::spawn_thread(opts.source.clone(), source_client, writer, health.clone(), metrics.clone(), stop.clone())
            .await
            .map_err(DaemonError::Source)?;
    // Opened before anything can stop the agent: an uninstall deletes the RBAC right after
    // the DaemonSet, and only a watch already open still shows the deletion.
    let removal = opts.removal.clone().map(|r| RemovalWatch::spawn(client.clone(), r, stop.clone()));
    // Watched beside the agent: watches that end early crash the daemon (see below).
    let informers = informers.finished();
    tokio::pin!(informers);

    // One agent per node: wait (informers already listing) while another holds the node.
    let _node_lock = match &opts.agent.state_dir {
        Some(dir) => {
            let mut waiting = stop.clone();
            match crate::agent::node_lock::acquire(&dir.join("agent.lock"), &mut waiting).await.map_err(DaemonError::Lock)? {
                Some(lock) => Some(lock),
                None => {
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut informers).await;
                    tracing::info!("flock-agent stopped before it took the node over");
                    return Ok(());
                }
            }
        }
        None => None,
    };

    let mut cfg = opts.agent.clone();
    cfg.full_resync = Some(health.resyncs());
    let agent = Agent::start(cfg, source.clone()).await.map_err(DaemonError::Agent)?;

    let state = HttpState {
        metrics: metrics.clone(),
        status: agent.status(),
        source: source.clone(),
        health: Some(health.clone()),
        max_sync_age: opts.max_sync_age,
        startup_grace: Duration::from_secs(300),
        started: Instant::now(),
    };
    let (listen, http_stop) = (opts.listen.clone(), stop.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = http::serve(listen, state, http_stop).await {
            tracing::error!(error = %e, "the health and metrics server failed");
        }
    }));

    // API health: metrics and logged transitions (the state changes with time alone).
    {
        let (health, metrics, mut stop) = (health.clone(), metrics.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = HealthState::Connected;
            health.export(metrics.as_ref());
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let now = health.state();
                if now != last {
                    tracing::warn!(
                        from = last.as_str(),
                        to = now.as_str(),
                        error = health.last_error().unwrap_or_default(),
                        "API server health changed; last-known rules stay in force"
                    );
                    last = now;
                }
                health.export(metrics.as_ref());
            }
        }));
    }

    // The CNI config, once ready, with this node's pod CIDRs.
    if let Some((dir, file)) = opts.cni_conf.clone() {
        let mut writer = Some(cniconf::Writer::new(
            &dir,
            &file,
            opts.agent.socket.clone(),
            opts.agent.spool_dir.clone(),
            opts.cni_mtu,
            opts.cni_host_ports.clone(),
        ));
        let (mut status, mut versions, source, node, mut stop) =
            (agent.status(), source.versions(), source.clone(), opts.agent.node.clone(), stop.clone());
        let (explicit_mtu, routing) =
            (opts.cni_mtu, if opts.agent.routes { opts.agent.routing.routing } else { crate::agent::routes::Routing::HostGw });
        tasks.push(tokio::spawn(async move {
            loop {
                let ready = status.borrow().ready;
                if ready && let Some(mut w) = writer.take() {
                    let (cidrs, own) =
                        source.read().snapshot.node(&node).map(|n| (n.pod_cidrs.clone(), n.internal_ips.clone())).unwrap_or_default();
                    // Under an overlay, unless --cni-mtu says otherwise, pods' MTU leaves
                    // room for the encapsulation.
                    if explicit_mtu.is_none() && !own.is_empty() {
                        match crate::agent::routes::overlay_pod_mtu(&own, routing).await {
                            Ok(Some(m)) if w.mtu != Some(m) => {
                                tracing::info!(mtu = m, "pods' MTU: the underlay's less the VXLAN encapsulation");
                                w.mtu = Some(m);
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "cannot find the underlay's MTU; pods keep the default"),
                        }
                    }
                    // A file write: on a blocking thread.
                    let job = tokio::task::spawn_blocking(move || {
                        let r = w.write(&cidrs);
                        (w, r, cidrs)
                    });
                    let Ok((w, result, cidrs)) = job.await else { return };
                    match result {
                        Ok(true) => tracing::info!(path = %w.path.display(), ?cidrs, "CNI network config written"),
                        Ok(false) if cidrs.is_empty() => tracing::debug!(node, "node has no pod CIDR yet: no CNI config"),
                        Ok(false) => {}
                        Err(e) => tracing::error!(error = %e, path = %w.path.display(), "cannot write the CNI network config"),
                    }
                    writer = Some(w);
                }
                tokio::select! {
                    _ = status.changed() => {}
                    _ = versions.changed() => {}
                    _ = stop.changed() => return,
                }
            }
        }));
    }

    // Policy problems: every agent counts the cluster's; the one holding the reporter Lease
    // publishes them as Events.
    tasks.push(tokio::spawn(reporter.run(source.clone(), metrics.clone(), stop.clone())));

    // This node's FlockNode: what its last commits enforce.
    if let Some(node_status) = opts.node_status.clone() {
        let writer = NodeStatusWriter::new(client.clone(), &opts.agent.node, node_status, metrics.clone());
        tasks.push(tokio::spawn(writer.run(agent.status(), health.clone(), stop.clone())));
    }

    let mut stop_rx = stop.clone();
    let stopped = async {
        while !*stop_rx.borrow() {
            if stop_rx.changed().await.is_err() {
                break;
            }
        }
    };
    // The informers end before `stop` only when a watch failed: the snapshot no longer
    // follows the cluster, and the agent must not go on enforcing it as current.
    // (`Ok` only once stopped.)
    let mut informers_ended = false;
    let crashed = tokio::select! {
        () = stopped => None,
        reason = agent.crashed() => Some(reason),
        ended = &mut informers => {
            informers_ended = true;
            ended.err().map(|e| e.to_string())
        }
    };
    agent.shutdown().await;
    if crashed.is_some() {
        // Nobody set `stop`: end the servers here (the informers' thread ends with the
        // process).
        for t in &tasks {
            t.abort();
        }
    } else if !informers_ended {
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut informers).await;
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    if let Some(reason) = crashed {
        return Err(DaemonError::Crashed(reason));
    }
    // The informers also end when `stop` is set, and may win the select above: what counts is
    // whether the stop was asked for (a watch that failed on its own is no removal).
    let asked_to_stop = *stop.borrow();
    if let (Some(watch), true) = (&removal, asked_to_stop) {
        match watch.verdict(Duration::from_secs(2)).await {
            Verdict::Removal(why) => {
                tracing::warn!(why, "flock is being removed from this node: removing its table, routes and devices");
                remove_from_node(&opts).await;
                return Ok(());
            }
            Verdict::Restart(why) => tracing::info!(why, "a restart, not a removal"),
        }
    }
    tracing::info!("flock-agent stopped; rules stay in place");
    Ok(())
}

/// flock's removal from the node ([`crate::removal::undo_node`]), logged.
async fn remove_from_node(opts: &DaemonOptions) {
    let a = &opts.agent;
    let leftovers = Leftovers {
        netns: a.netns.clone(),
        nft: a.nft.clone(),
        dns: a.dns.clone(),
        cni_conf: opts.cni_conf.as_ref().map(|(dir, file)| dir.join(file)),
        cni_bin_dir: opts.removal.as_ref().map(|r| r.cni_bin_dir.clone()).unwrap_or_default(),
        state_dir: a.state_dir.clone(),
        spool_dir: a.spool_dir.clone(),
        socket: a.socket.clone(),
    };
    let u = crate::removal::undo_node(&leftovers).await;
    for e in &u.errors {
        tracing::error!(error = %e, "flock's removal left something on the node");
    }
    let removed: Vec<String> = u.removed.iter().map(|p| p.display().to_string()).collect();
    match u.pods_left {
        Some(0) => tracing::info!(
            table = u.table,
            routes = u.routes,
            devices = u.devices,
            dns_routing = u.dns_routing,
            ?removed,
            "flock removed from this node: no pod of it was left, the CNI config and flock-cni are gone"
        ),
        Some(n) => tracing::warn!(
            table = u.table,
            routes = u.routes,
            devices = u.devices,
            dns_routing = u.dns_routing,
            pods = n,
            "flock removed from this node; its CNI config stays (marked) until flock-cni's DEL of the last of these pods removes it: new pods here need another CNI network"
        ),
        None => tracing::warn!(
            table = u.table,
            routes = u.routes,
            devices = u.devices,
            dns_routing = u.dns_routing,
            "flock removed from this node; its CNI config stays (marked) for flock-cni to remove after the node's last pod"
        ),
    }
}
