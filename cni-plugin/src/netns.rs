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
