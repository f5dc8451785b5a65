//! The agent's side of the flock-cni contract (`flock_cni::protocol`): a root-only unix
//! socket, one request per connection.
//!
//! - `add`: validated (the interface name must be the one flock-cni derives from the
//!   container id and ifname), then waits — bounded — for the Pod to appear in the source
//!   (a watch may lag behind the runtime), registers the endpoint and acknowledges only
//!   after a sync that includes it has committed. A failed or late sync is a refusal, and
//!   flock-cni rolls the ADD back with code 11.
//! - `del` removes the endpoint (acknowledged once synced, or after a bounded wait: the
//!   interface is gone either way); `check` says whether the endpoint is programmed;
//!   `status` whether the agent has committed its first sync; `gc` drops endpoints whose
//!   attachment is not listed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flock_cni::protocol::{self, AddRequest, Reply, Request};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::Shared;
use crate::model::{LocalEndpoint, ObjectRef};

/// Binds the socket: its directory is created, a stale socket file removed, and the socket
/// made root-only (0600).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub(super) async fn serve(shared: Arc<Shared>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handle(shared, conn).await {
                            tracing::warn!(error = %e, "CNI connection failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::error!(error = %e, "accepting a CNI connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}

async fn handle(shared: Arc<Shared>, conn: UnixStream) -> std::io::Result<()> {
    let (read, mut write) = conn.into_split();
    let mut reader = BufReader::new(read.take(protocol::MAX_LINE as u64 + 1));
    let mut line = String::new();
    let reply = match tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line)).await {
        Err(_) => Reply::refused("no request within 10s"),
        Ok(Err(e)) => Reply::refused(format!("unreadable request: {e}")),
        Ok(Ok(0)) => return Ok(()),
        Ok(Ok(_)) => match protocol::decode_request(line.trim_end()) {
            Ok(req) => {
                let op = req.op();
                let started = std::time::Instant::now();
                let reply = dispatch(&shared, req).await;
                tracing::info!(op, ok = reply.ok, error = reply.error.as_deref().unwrap_or(""), "CNI request");
                shared.config.metrics.cni(op, reply.ok);
                if op == "add" && reply.ok {
                    shared.config.metrics.enforced("cni", started.elapsed().as_secs_f64());
                }
                reply
            }
            Err(e) => Reply::refused(e),
        },
    };
    write.write_all(&protocol::encode_reply(&reply)).await?;
    write.shutdown().await
}

async fn dispatch(shared: &Arc<Shared>, req: Request) -> Reply {
    match req {
        Request::Add(add) => match endpoint_of(&add) {
            Err(e) => Reply::refused(e),
            Ok(ep) => add_endpoint(shared, ep).await,
        },
        Request::Del(del) => {
            let iface = del.host_interface.clone();
            shared.note_del(&iface);
            let generation = shared.change_endpoints(|eps| eps.remove(&iface).is_some());
            // The interface is gone already; the wait only keeps DEL from racing a re-ADD.
            let _ = shared.wait_committed(generation, Duration::from_secs(5)).await;
            Reply::ok()
        }
        Request::Check(check) => {
            let registered = shared.lock().endpoints.contains_key(&check.host_interface);
            let status = shared.status.borrow().clone();
            if !registered {
                Reply::refused(format!("no endpoint {} on this node", check.host_interface))
            } else if let Some(e) = status.error {
                Reply::refused(format!("the last sync failed: {e}"))
            } else {
                Reply::ok()
            }
        }
        Request::Status => {
            if shared.status.borrow().ready {
                Reply::ok()
            } else {
                Reply::refused("no sync has committed yet")
            }
        }
        Request::Gc(gc) => {
            let valid: std::collections::BTreeSet<String> =
                gc.valid.iter().map(|a| flock_cni::host_interface_name(&a.container_id, &a.ifname)).collect();
            let generation = shared.change_endpoints(|eps| {
                let before = eps.len();
                eps.retain(|iface, _| valid.contains(iface));
                eps.len() != before
            });
            // As for DEL: the reply means the stale endpoints' rules are gone (bounded wait).
            let _ = shared.wait_committed(generation, Duration::from_secs(5)).await;
            Reply::ok()
        }
    }
}

/// Validates an ADD into an endpoint. Only a name of the exact shape flock-cni derives can
/// reach the ruleset.
fn endpoint_of(add: &AddRequest) -> Result<LocalEndpoint, String> {
    if !flock_cni::env::valid_container_id(&add.container_id) {
        return Err(format!("invalid container id {:?}", add.container_id));
    }
    let expected = flock_cni::host_interface_name(&add.container_id, &add.ifname);
    if add.host_interface != expected {
        return Err(format!("host interface {:?} is not the one for {}/{} ({expected})", add.host_interface, add.container_id, add.ifname));
    }
    if add.pod.namespace.is_empty() || add.pod.name.is_empty() {
        return Err("the pod's namespace and name are required".into());
    }
    if add.ips.is_empty() || add.ips.iter().filter(|i| i.is_ipv4()).count() > 1 || add.ips.iter().filter(|i| i.is_ipv6()).count() > 1 {
        return Err(format!("a pod has one or two addresses (one per family), not {:?}", add.ips));
    }
    Ok(LocalEndpoint {
        interface: add.host_interface.clone(),
        container_id: add.container_id.clone(),
        pod: ObjectRef::new(add.pod.namespace.clone(), add.pod.name.clone()),
        pod_uid: add.pod.uid.clone(),
        addrs: add.ips.clone(),
    })
}

async fn add_endpoint(shared: &Arc<Shared>, ep: LocalEndpoint) -> Reply {
    let cfg = &shared.config;
    // The Pod may not have reached the source yet: wait for it, bounded.
    let mut versions = shared.source.versions();
    let source = shared.source.clone();
    let known = |v: &Option<u64>| {
        v.is_some() && {
            let st = source.read();
            match &ep.pod_uid {
                Some(uid) => st.snapshot.pod(uid).is_some_and(|p| p.namespace == ep.pod.namespace && p.name == ep.pod.name),
                None => st.snapshot.pod_by_name(&ep.pod).is_some(),
            }
        }
    };
    let iface = ep.interface.clone();
    let pod = ep.pod.clone();
    // A DEL that overtakes this ADD while it waits (the plugin gave up and withdrew it) wins.
    let token = shared.begin_add(&iface);
    if let Err(_elapsed) = tokio::time::timeout(cfg.pod_wait, versions.wait_for(known)).await {
        shared.finish_add(token, &iface, None);
        return Reply::refused(format!("pod {pod} is not known to the agent after {:?}", cfg.pod_wait));
    }
    let Some(generation) = shared.finish_add(token, &iface, Some(ep)) else {
        tracing::info!(%pod, interface = %iface, "ADD withdrawn by a DEL while it waited; nothing registered");
        return Reply::refused(format!("the ADD of {iface} was withdrawn by a DEL while it waited for pod {pod}"));
    };
    // Acknowledged once committed to the kernel and to the registry on disk: a restart must
    // not forget a pod the runtime was told is wired.
    let durable = async {
        shared.wait_committed(generation, cfg.ack_timeout).await?;
        match tokio::time::timeout(cfg.ack_timeout, shared.persister.wait(generation)).await {
            Ok(r) => r,
            Err(_) => Err(format!("the endpoint registry was not written within {:?}", cfg.ack_timeout)),
        }
    };
    match durable.await {
        Ok(()) => {
            tracing::info!(%pod, interface = %iface, generation = generation, "endpoint programmed");
            Reply::ok()
        }
        Err(e) => Reply::refused(e),
    }
}
