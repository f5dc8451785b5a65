//! One flock-agent at a time on a node: an exclusive `flock(2)` on `agent.lock` in the state
//! directory (a hostPath, shared by every agent pod of the node). Two agents would each
//! program the table from their own endpoint registry (the newcomer's pods unknown to the
//! other, whose syncs would remove their rules) and race on the registry file and the CNI
//! socket; so an agent takes the lock before it binds the CNI socket, loads the registry or
//! touches nft, and holds it until it has stopped. A second agent (a surge rollout, a pod
//! stuck terminating, one started by hand) waits, its informers already listing, and takes
//! over the moment the first is gone: the kernel drops the lock with the last descriptor, so
//! a SIGKILLed holder releases it too — no stale lock files, nothing to clean up.
//!
//! The holder writes its pid into the file (for `cat /var/lib/flock/agent.lock`); the lock
//! itself is the kernel's, not the content.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tokio::sync::watch;

/// How often a waiting agent tries the lock again.
const POLL: Duration = Duration::from_millis(50);

/// The held lock; released on drop (and by the kernel when the process ends).
#[derive(Debug)]
pub(crate) struct NodeLock {
    _lock: Flock<File>,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum NodeLockError {
    #[error("cannot open the node lock {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("cannot lock {path}: {source}")]
    Lock { path: PathBuf, source: nix::Error },
}

/// Takes the lock at `path`, waiting while another agent holds it; `None` when `stop` came
/// first.
pub(crate) async fn acquire(path: &Path, stop: &mut watch::Receiver<bool>) -> Result<Option<NodeLock>, NodeLockError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| NodeLockError::Open { path: path.to_path_buf(), source })?;
    }
    let started = Instant::now();
    let mut waiting = false;
    loop {
        // Opened afresh each time: a failed attempt hands the descriptor back.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| NodeLockError::Open { path: path.to_path_buf(), source })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // Who holds it, for people; a failure here changes nothing.
                let _ = lock.set_len(0).and_then(|()| lock.rewind()).and_then(|()| writeln!(lock, "{}", std::process::id()));
                if waiting {
                    tracing::info!(path = %path.display(), waited = ?started.elapsed(), "took the node lock: this agent takes over");
                }
                return Ok(Some(NodeLock { _lock: lock }));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                if !waiting {
                    let holder = std::fs::read_to_string(path).unwrap_or_default();
                    tracing::warn!(
                        path = %path.display(),
                        holder_pid = holder.trim(),
                        "another flock-agent holds this node's lock: waiting for it to stop before enforcing (its rules stay in force)"
                    );
                    waiting = true;
                }
            }
            Err((_, e)) => return Err(NodeLockError::Lock { path: path.to_path_buf(), source: e }),
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return Ok(None) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_waits_until_the_first_is_gone() {
        let dir = std::env::temp_dir().join(format!("flock-node-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("state/agent.lock");
        let (_tx, mut stop) = watch::channel(false);
        let first = acquire(&path, &mut stop).await.unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), std::process::id().to_string());
        // flock(2) locks belong to the open file description: a second open in this process
        // conflicts like another process would.
        let p = path.clone();
        let second = tokio::spawn(async move {
            let (_tx, mut stop) = watch::channel(false);
            acquire(&p, &mut stop).await.unwrap().is_some()
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "took a held lock");
        drop(first);
        assert!(tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap());
        // A waiter told to stop gives up.
        let _held = acquire(&path, &mut stop).await.unwrap().unwrap();
        let (tx, mut stop2) = watch::channel(false);
        let p = path.clone();
        let waiter = tokio::spawn(async move { acquire(&p, &mut stop2).await.unwrap().is_none() });
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(true).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
