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

/// Binds the socket at `path`, root-only (0600) from the moment anyone can reach it.
///
/// Binding at `path` and then chmod-ing it would leave a window in which the socket exists
/// with the umask's permissions and any local user could connect. So the socket is bound
/// inside a fresh private directory (0700, created next to `path`, so on the same file
/// system), made 0600 there, and renamed into place: a bound unix socket keeps working under
/// its new name, and the rename atomically replaces a stale socket left at `path` by an
/// earlier run. The private directory is removed again. `path`'s directory is created if
/// missing. The socket is bound at `.<name>.<pid>-<n>/s` beside `path`'s `<name>`, a dozen
/// bytes longer: both must fit a unix socket address (107 bytes).
///
/// Errors name the file or directory that failed.
pub(crate) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let Some(name) = path.file_name() else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display())));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| context(e, "creating", dir))?;
    // A fresh directory: an existing one (a crashed bind's, or anyone's) is never reused.
    let mut private = None;
    for attempt in 0..16 {
        let candidate = dir.join(format!(".{}.{}-{attempt}", name.to_string_lossy(), std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => {
                private = Some(candidate);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(context(e, "creating", &candidate)),
        }
    }
    let Some(private) = private else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("creating a private directory for the socket in {}: 16 names were taken", dir.display()),
        ));
    };
    let temp = private.join("s");
    let placed = UnixListener::bind(&temp).map_err(|e| context(e, "binding", &temp)).and_then(|listener| {
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600)).map_err(|e| context(e, "making 0600", &temp))?;
        std::fs::rename(&temp, path).map_err(|e| context(e, &format!("moving the socket {} to", temp.display()), path))?;
        Ok(listener)
    });
    if placed.is_err() {
        // Whatever was made: the socket, if it was bound but not moved.
        let _ = std::fs::remove_file(&temp);
    }
    if let Err(e) = std::fs::remove_dir(&private) {
        // The socket is in place (or the error is reported already): only an empty
        // directory is left behind.
        tracing::warn!(dir = %private.display(), error = %e, "cannot remove the socket's temporary directory");
    }
    placed
}

/// `e`, naming what was done to `path`.
fn context(e: std::io::Error, what: &str, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
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
    // A request that wires or unwires pods: revocation sweeps give way while they come.
    let _busy = matches!(req, Request::Add(_) | Request::Del(_) | Request::Gc(_)).then(|| shared.cni_request());
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
            Err(_) => Err(super::WaitError::NotPersisted { timeout: cfg.ack_timeout }),
        }
    };
    match durable.await {
        Ok(()) => {
            tracing::info!(%pod, interface = %iface, generation = generation, "endpoint programmed");
            Reply::ok()
        }
        Err(e) => Reply::refused(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn test_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("flock-cni-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// The socket appears at its path already 0600 (it is bound in a private directory and
    /// renamed there), replaces a stale one, accepts connections, and leaves nothing else.
    #[tokio::test]
    async fn the_socket_is_root_only_when_it_appears_and_works() {
        let dir = test_dir("bind");
        let path = dir.join("sub").join("cni.sock");
        // A stale socket of an earlier run, left world-accessible.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();

        let listener = bind(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(entries(path.parent().unwrap()), ["cni.sock"], "the private directory is gone");

        let mut client = UnixStream::connect(&path).await.unwrap();
        let (mut conn, _) = listener.accept().await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");

        // Binding again (a restart) replaces the socket in place.
        drop(listener);
        let again = bind(&path).unwrap();
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().permissions().mode() & 0o7777, 0o600);
        drop(UnixStream::connect(&path).await.unwrap());
        drop(again);
        assert_eq!(entries(path.parent().unwrap()), ["cni.sock"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn bind_errors_name_the_path_and_leave_nothing_behind() {
        let dir = test_dir("bind-err");
        // The socket's path is a directory that is not empty: the rename fails.
        let path = dir.join("cni.sock");
        std::fs::create_dir_all(path.join("keep")).unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert_eq!(entries(&dir), ["cni.sock"], "the private directory is removed on failure too");
        assert_eq!(entries(&path), ["keep"]);
        // Its directory cannot be created: a file is in the way.
        let blocked = dir.join("file");
        std::fs::write(&blocked, b"").unwrap();
        let e = bind(&blocked.join("cni.sock")).unwrap_err().to_string();
        assert!(e.contains(&blocked.display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
