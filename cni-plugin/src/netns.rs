//! Running work inside a network namespace.
//!
//! A network namespace is a per-thread attribute on Linux, so work for another namespace runs
//! on a short-lived thread of its own that enters the namespace first; no shared thread (and
//! never an async worker) changes namespace. Processes spawned from that thread (`nft`,
//! `ip`) start in the namespace too.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

/// Where a piece of work runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Netns {
    /// The caller's namespace.
    #[default]
    Current,
    /// The namespace bound at this path (`/run/netns/NAME`, `/proc/PID/ns/net`).
    Path(PathBuf),
    /// A new, empty namespace for each piece of work (checks that must not see the host).
    Fresh,
}

impl Netns {
    /// The namespace `ip netns add NAME` created.
    pub fn named(name: &str) -> Self {
        Self::Path(Path::new("/run/netns").join(name))
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Current => "the current network namespace".into(),
            Self::Path(p) => format!("network namespace {}", p.display()),
            Self::Fresh => "a new network namespace".into(),
        }
    }
}

/// Why work could not run in a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("the thread working in network namespace {path} panicked")]
    Panicked { path: PathBuf },
}

/// The calling thread's network namespace (a namespace is per thread).
pub const OWN_NETNS: &str = "/proc/thread-self/ns/net";

/// The identity of the namespace bound at `path`: the device and inode of its nsfs file.
/// `/run/netns/NAME`, `/proc/PID/ns/net`, a bind mount or a symlink may all name one
/// namespace, and a path may come to name another one.
pub fn identity(path: &Path) -> Result<(u64, u64), NetnsError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|source| NetnsError::Open { path: path.to_path_buf(), source })?;
    Ok((m.dev(), m.ino()))
}

/// Whether `path` names the calling thread's own network namespace (compared by
/// [`identity`], not by path).
pub fn is_current(path: &Path) -> Result<bool, NetnsError> {
    Ok(identity(path)? == identity(Path::new(OWN_NETNS))?)
}

/// Runs `f` in `ns` and returns its result.
pub fn run_in<T: Send>(ns: &Netns, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let path = match ns {
        Netns::Current => return Ok(f()),
        Netns::Fresh => return run_in_new(f),
        Netns::Path(path) => path,
    };
    let file = File::open(path).map_err(|source| NetnsError::Open { path: path.clone(), source })?;
    run_in_file(&file, path, f)
}

/// Runs `f` on a thread that has entered the namespace open as `file` (whose path, for
/// errors, is `path`).
pub fn run_in_file<T: Send>(file: &File, path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter { path: path.to_path_buf(), source })?;
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Panicked { path: path.to_path_buf() })?
    })
}

/// Runs `f` in a new, empty network namespace that disappears when `f` returns and the
/// processes it started have exited (for checks that must not see the host's rulesets).
pub fn run_in_new<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let path = PathBuf::from("<new network namespace>");
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter { path: path.clone(), source })?;
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Panicked { path: path.clone() })?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_is_recognised_by_identity_not_path() {
        // Three paths, one namespace (this test's thread and process share it).
        assert!(is_current(Path::new("/proc/self/ns/net")).unwrap());
        assert!(is_current(Path::new(&format!("/proc/{}/ns/net", std::process::id()))).unwrap());
        // Another namespace file (of another type) is not the network namespace.
        assert!(!is_current(Path::new("/proc/self/ns/uts")).unwrap());
        assert!(!is_current(Path::new("/proc/self/ns/mnt")).unwrap());
        // A thread in a new namespace (needs CAP_SYS_ADMIN: checked only with it) is not in
        // the process's (/proc/self is the main thread's).
        if let Ok(fresh) = run_in_new(|| is_current(Path::new("/proc/self/ns/net"))) {
            assert!(!fresh.unwrap());
        }
        assert!(matches!(is_current(Path::new("/nonexistent/ns")), Err(NetnsError::Open { .. })));
    }
}
