//! The persisted endpoint registry (`<state dir>/endpoints.json`) and the thread that writes
//! it.
//!
//! The registry changes on async tasks (CNI ADD/DEL/GC), which must not block on file I/O,
//! so writes go to one dedicated thread. Each change hands it the registry as of that
//! generation; the thread writes the latest one (a burst of changes makes one write) with a
//! write-then-rename, and publishes the generation it made durable. An ADD is acknowledged
//! only once its generation is durable: a restart must not forget a pod the runtime was
//! told is wired.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::model::{LocalEndpoint, ObjectRef};

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    interface: String,
    container_id: String,
    namespace: String,
    name: String,
    #[serde(default)]
    uid: Option<String>,
    addrs: Vec<std::net::IpAddr>,
}

const FILE: &str = "endpoints.json";

/// Why the registry file cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("not a registry: {0}")]
    Parse(#[from] serde_json::Error),
}

/// Reads the registry in `dir` (empty when there is none yet).
pub(crate) fn load(dir: &Path) -> Result<BTreeMap<String, LocalEndpoint>, LoadError> {
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.into()),
    };
    let entries: Vec<Entry> = serde_json::from_slice(&bytes)?;
    Ok(entries
        .into_iter()
        .filter(|e| flock_cni::is_host_interface_name(&e.interface))
        .map(|e| {
            let ep = LocalEndpoint {
                interface: e.interface.clone(),
                container_id: e.container_id,
                pod: ObjectRef::new(e.namespace, e.name),
                pod_uid: e.uid,
                addrs: e.addrs,
            };
            (e.interface, ep)
        })
        .collect())
}

fn entries(eps: &BTreeMap<String, LocalEndpoint>) -> Vec<Entry> {
    eps.values()
        .map(|e| Entry {
            interface: e.interface.clone(),
            container_id: e.container_id.clone(),
            namespace: e.pod.namespace.clone(),
            name: e.pod.name.clone(),
            uid: e.pod_uid.clone(),
            addrs: e.addrs.clone(),
        })
        .collect()
}

fn save(dir: &Path, entries: &[Entry]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(entries)?)?;
    std::fs::rename(tmp, dir.join(FILE))
}

/// What the writer thread has made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Persisted {
    /// The last generation written (or attempted, when `error` is set).
    pub(crate) generation: u64,
    /// Why the last write failed.
    pub(crate) error: Option<String>,
}

#[derive(Default)]
struct Queue {
    latest: Option<(u64, Vec<Entry>)>,
    stop: bool,
}

type Shared = Arc<(Mutex<Queue>, Condvar)>;

fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes the registry on its own thread (see the module doc). Without a state directory it
/// keeps nothing and every generation is durable at once.
pub(crate) struct Persister {
    dir: Option<PathBuf>,
    queue: Shared,
    persisted: watch::Sender<Persisted>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Persister {
    pub(crate) fn start(dir: Option<PathBuf>) -> std::io::Result<Self> {
        let queue: Shared = Arc::default();
        let persisted = watch::channel(Persisted::default()).0;
        let thread = match &dir {
            None => None,
            Some(d) => {
                let (d, q, tx) = (d.clone(), queue.clone(), persisted.clone());
                Some(std::thread::Builder::new().name("flock-registry".into()).spawn(move || write_loop(&d, &q, &tx))?)
            }
        };
        Ok(Self { dir, queue, persisted, thread: Mutex::new(thread) })
    }

    /// Queues the registry as of `generation` (call in generation order, e.g. under the
    /// registry's lock).
    pub(crate) fn submit(&self, generation: u64, eps: &BTreeMap<String, LocalEndpoint>) {
        if self.dir.is_none() {
            self.persisted.send_replace(Persisted { generation, error: None });
            return;
        }
        let (q, cv) = &*self.queue;
        lock(q).latest = Some((generation, entries(eps)));
        cv.notify_one();
    }

    /// Waits until `generation` (or a later one) is durable; the write error otherwise.
    pub(crate) async fn wait(&self, generation: u64) -> Result<(), super::WaitError> {
        let mut rx = self.persisted.subscribe();
        match rx.wait_for(|p| p.generation >= generation).await {
            Ok(p) => match &p.error {
                None => Ok(()),
                Some(e) => Err(super::WaitError::Persist {
                    dir: self.dir.as_deref().map(|d| d.display().to_string()).unwrap_or_default(),
                    error: e.to_string(),
                }),
            },
            Err(_) => Err(super::WaitError::WriterStopped),
        }
    }

    /// Writes what is queued, then stops the thread.
    pub(crate) fn stop(&self) {
        let (q, cv) = &*self.queue;
        lock(q).stop = true;
        cv.notify_one();
        let handle = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(h) = handle
            && h.join().is_err()
        {
            tracing::error!("the registry writer thread panicked");
        }
    }
}

impl Drop for Persister {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_loop(dir: &Path, queue: &Shared, persisted: &watch::Sender<Persisted>) {
    let (q, cv) = &**queue;
    loop {
        let (next, stop) = {
            let mut g = lock(q);
            while g.latest.is_none() && !g.stop {
                g = cv.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            (g.latest.take(), g.stop)
        };
        if let Some((generation, entries)) = next {
            let error = save(dir, &entries).err().map(|e| e.to_string());
            if let Some(e) = &error {
                tracing::error!(error = %e, dir = %dir.display(), "cannot persist the endpoint registry");
            }
            persisted.send_replace(Persisted { generation, error });
        }
        if stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(name: &str) -> (String, LocalEndpoint) {
        let iface = flock_cni::host_interface_name(&format!("cid-{name}"), "eth0");
        let e = LocalEndpoint {
            interface: iface.clone(),
            container_id: format!("cid-{name}"),
            pod: ObjectRef::new("default", name),
            pod_uid: None,
            addrs: vec!["198.18.9.1".parse().unwrap()],
        };
        (iface, e)
    }

    #[tokio::test]
    async fn writes_the_latest_generation_off_the_async_task_and_reads_it_back() {
        let dir = std::env::temp_dir().join(format!("flock-registry-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = Persister::start(Some(dir.clone())).unwrap();
        let mut eps = BTreeMap::new();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let (k, v) = ep(name);
            eps.insert(k, v);
            p.submit(i as u64 + 1, &eps);
        }
        p.wait(3).await.unwrap();
        assert_eq!(load(&dir).unwrap(), eps);
        p.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_write_that_fails_is_reported_to_the_waiter() {
        // A file where the directory should be: every write fails.
        let file = std::env::temp_dir().join(format!("flock-registry-file-{}", std::process::id()));
        std::fs::write(&file, b"not a directory").unwrap();
        let p = Persister::start(Some(file.clone())).unwrap();
        p.submit(1, &BTreeMap::from([ep("a")]));
        let e = p.wait(1).await.unwrap_err();
        assert!(matches!(e, crate::agent::WaitError::Persist { .. }), "{e}");
        p.stop();
        let _ = std::fs::remove_file(&file);
    }

    #[tokio::test]
    async fn without_a_directory_every_generation_is_durable_at_once() {
        let p = Persister::start(None).unwrap();
        p.submit(7, &BTreeMap::new());
        p.wait(7).await.unwrap();
    }
}
