//! Sources of cluster state for the node agent.
//!
//! A source owns one [`Snapshot`] behind an `Arc`, with a version that increases on every
//! change, published on a watch channel. Readers that work long on it (the sync loop's
//! translate and render) take the `Arc` and release the lock at once ([`Source::snapshot`]),
//! so the watcher is never blocked behind them. The writer changes the snapshot in place
//! (`Arc::make_mut`): a cluster-wide snapshot of 150,000 pods is too big to copy per event,
//! and it is copied only when a reader still holds the previous version — at most once per
//! sync, and pods themselves are shared (`Arc<Pod>`), so the copy is of the indexes. The channel carries `None` until the source is
//! *complete* (every initial list finished): the agent never programs nft before that.
//!
//! [`StaticSource`] is fed from manifests and can be changed while running (the simulated
//! cluster and the conformance runner apply and delete objects through it); the Kubernetes
//! informer source ([`kube`]) writes through the same [`SourceWriter`].

pub mod kube;

use std::collections::VecDeque;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use tokio::sync::watch;

use crate::model::Snapshot;

/// A snapshot and its version.
#[derive(Debug, Default)]
pub struct Versioned {
    pub version: u64,
    pub snapshot: Arc<Snapshot>,
    /// When recent versions were made (bounded), so consumers can measure how long a change
    /// took to be enforced.
    pub changed_at: VecDeque<(u64, Instant)>,
}

/// How many change times [`Versioned::changed_at`] keeps.
const CHANGE_HISTORY: usize = 65_536;

/// The reading side: shared, cheap to clone.
#[derive(Clone)]
pub struct Source {
    state: Arc<RwLock<Versioned>>,
    rx: watch::Receiver<Option<u64>>,
}

impl Source {
    /// The current state (hold the guard briefly; writers wait for it).
    pub fn read(&self) -> RwLockReadGuard<'_, Versioned> {
        match self.state.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The current snapshot, its version and when recent versions were made, without
    /// holding the lock (see the module doc).
    pub fn snapshot(&self) -> (u64, Arc<Snapshot>) {
        let g = self.read();
        (g.version, Arc::clone(&g.snapshot))
    }

    /// `None` until complete, then the latest published version.
    pub fn versions(&self) -> watch::Receiver<Option<u64>> {
        self.rx.clone()
    }

    pub fn is_complete(&self) -> bool {
        self.rx.borrow().is_some()
    }
}

/// The writing side.
pub struct SourceWriter {
    state: Arc<RwLock<Versioned>>,
    tx: watch::Sender<Option<u64>>,
}

impl SourceWriter {
    /// A source holding `snapshot`, complete or not yet.
    pub fn new(snapshot: Snapshot, complete: bool) -> (Self, Source) {
        let state = Arc::new(RwLock::new(Versioned { version: 1, snapshot: Arc::new(snapshot), changed_at: VecDeque::new() }));
        let (tx, rx) = watch::channel(complete.then_some(1));
        (Self { state: state.clone(), tx }, Source { state, rx })
    }

    fn write(&self) -> RwLockWriteGuard<'_, Versioned> {
        match self.state.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Changes the snapshot with `f`; publishes the new version if the source is complete.
    pub fn update<T>(&self, f: impl FnOnce(&mut Snapshot) -> T) -> (u64, T) {
        let (version, out) = {
            let mut g = self.write();
            let out = f(Arc::make_mut(&mut g.snapshot));
            g.version += 1;
            let v = g.version;
            if g.changed_at.len() >= CHANGE_HISTORY {
                g.changed_at.pop_front();
            }
            g.changed_at.push_back((v, Instant::now()));
            (v, out)
        };
        if self.tx.borrow().is_some() {
            self.tx.send_replace(Some(version));
        }
        (version, out)
    }

    /// Marks the source complete (every initial list done) and publishes.
    pub fn set_complete(&self) {
        let v = match self.state.read() {
            Ok(g) => g.version,
            Err(p) => p.into_inner().version,
        };
        self.tx.send_replace(Some(v));
    }

    pub fn reader(&self) -> Source {
        Source { state: self.state.clone(), rx: self.tx.subscribe() }
    }
}

/// A complete source whose content the caller sets.
pub struct StaticSource {
    writer: SourceWriter,
}

impl StaticSource {
    /// A complete source holding `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self { writer: SourceWriter::new(snapshot, true).0 }
    }

    pub fn subscribe(&self) -> Source {
        self.writer.reader()
    }

    /// Changes the snapshot with `f` and publishes it; the new version.
    pub fn update(&self, f: impl FnOnce(&mut Snapshot)) -> u64 {
        self.writer.update(f).0
    }

    /// A copy of the current snapshot and its version.
    pub fn current(&self) -> (u64, Snapshot) {
        let g = self.writer.reader();
        let r = g.read();
        (r.version, Snapshot::clone(&r.snapshot))
    }
}
