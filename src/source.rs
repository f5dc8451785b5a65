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
//! Every change is also journaled ([`Versioned::changes`]), so the sync loop can translate
//! only what changed since the version it last translated ([`Source::changes`]).
//!
//! [`StaticSource`] is fed from manifests and can be changed while running (the simulated
//! cluster and the conformance runner apply and delete objects through it); the Kubernetes
//! informer source ([`kube`]) writes through the same [`SourceWriter`].

pub mod files;
pub mod kube;

use std::collections::VecDeque;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use tokio::sync::watch;

use crate::model::{Change, Snapshot};

/// A snapshot and its version.
#[derive(Debug, Default)]
pub struct Versioned {
    pub version: u64,
    pub snapshot: Arc<Snapshot>,
    /// When recent versions were made (bounded), so consumers can measure how long a change
    /// took to be enforced.
    pub(crate) changed_at: VecDeque<(u64, Instant)>,
    /// The objects each recent version changed (bounded: see [`Self::journal_from`]).
    pub(crate) changes: VecDeque<(u64, Vec<Change>)>,
    /// The journal holds every change of the versions after this one.
    pub(crate) journal_from: u64,
    /// Changes in the journal.
    journal_len: usize,
}

/// How many change times [`Versioned::changed_at`] keeps.
const CHANGE_HISTORY: usize = 65_536;
/// How many changed objects [`Versioned::changes`] keeps. Past that many changes since its
/// last sync, a reader translates in full (about as fast, then).
const CHANGE_JOURNAL: usize = 65_536;

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

    /// Every object changed after version `after` up to version `upto`, in order; `None` when
    /// the journal no longer reaches back to `after` (translate in full).
    pub(crate) fn changes(&self, after: u64, upto: u64) -> Option<Vec<Change>> {
        let g = self.read();
        if after < g.journal_from {
            return None;
        }
        Some(g.changes.iter().filter(|(v, _)| *v > after && *v <= upto).flat_map(|(_, c)| c.iter().cloned()).collect())
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
    pub fn new(mut snapshot: Snapshot, complete: bool) -> (Self, Source) {
        snapshot.take_changes();
        snapshot.record_changes();
        let state = Arc::new(RwLock::new(Versioned {
            version: 1,
            snapshot: Arc::new(snapshot),
            changed_at: VecDeque::new(),
            changes: VecDeque::new(),
            journal_from: 1,
            journal_len: 0,
        }));
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
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut Snapshot) -> T) -> (u64, T) {
        let (version, out) = {
            let mut g = self.write();
            let snapshot = Arc::make_mut(&mut g.snapshot);
            // make_mut clones the snapshot while a reader holds it, and a clone does not record.
            snapshot.record_changes();
            let out = f(snapshot);
            // `f` replaced the snapshot wholesale (a clone or a new one does not record): its
            // changes are unknown, so the journal starts again from this version.
            let replaced = !snapshot.is_recording();
            snapshot.record_changes();
            let changes = snapshot.take_changes();
            g.version += 1;
            let v = g.version;
            if g.changed_at.len() >= CHANGE_HISTORY {
                g.changed_at.pop_front();
            }
            g.changed_at.push_back((v, Instant::now()));
            if replaced {
                g.changes.clear();
                g.journal_len = 0;
                g.journal_from = v;
            } else {
                g.journal_len += changes.len();
                g.changes.push_back((v, changes));
            }
            while g.journal_len > CHANGE_JOURNAL {
                let Some((old, c)) = g.changes.pop_front() else { break };
                g.journal_len -= c.len();
                g.journal_from = old;
            }
            (v, out)
        };
        if self.tx.borrow().is_some() {
            self.tx.send_replace(Some(version));
        }
        (version, out)
    }

    /// Marks the source complete (every initial list done) and publishes.
    pub(crate) fn set_complete(&self) {
        let v = match self.state.read() {
            Ok(g) => g.version,
            Err(p) => p.into_inner().version,
        };
        self.tx.send_replace(Some(v));
    }

    pub(crate) fn reader(&self) -> Source {
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
    #[cfg(feature = "tool")]
    pub(crate) fn current(&self) -> (u64, Snapshot) {
        let g = self.writer.reader();
        let r = g.read();
        (r.version, Snapshot::clone(&r.snapshot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Namespace, ObjectRef};

    fn ns(name: &str) -> Namespace {
        Namespace { name: name.into(), ..Namespace::default() }
    }

    #[test]
    fn the_journal_gives_every_change_since_a_version_until_it_no_longer_reaches_back() {
        let (writer, source) = SourceWriter::new(Snapshot::new(), true);
        let (v2, ()) = writer.update(|s| s.upsert_namespace(ns("a")));
        let (v3, ()) = writer.update(|s| {
            s.remove_namespace("a");
            s.remove_policy(&ObjectRef::new("a", "p"));
        });
        assert_eq!(
            source.changes(1, v3),
            Some(vec![Change::Namespace("a".into()), Change::Namespace("a".into()), Change::Policy(ObjectRef::new("a", "p"))])
        );
        assert_eq!(source.changes(v2, v3).map(|c| c.len()), Some(2));
        assert_eq!(source.changes(v3, v3), Some(vec![]));
        // More changes than the journal keeps: the older versions can no longer be served.
        let (v4, ()) = writer.update(|s| {
            for i in 0..=CHANGE_JOURNAL {
                s.upsert_namespace(ns(&format!("n{i}")));
            }
        });
        assert_eq!(source.changes(v3, v4), None);
        assert_eq!(source.changes(1, v4), None);
        let (v5, ()) = writer.update(|s| s.upsert_namespace(ns("b")));
        assert_eq!(source.changes(v4, v5), Some(vec![Change::Namespace("b".into())]));
    }

    #[test]
    fn a_snapshot_replaced_wholesale_restarts_the_journal_and_a_held_one_still_records() {
        let (writer, source) = SourceWriter::new(Snapshot::new(), true);
        let (v2, ()) = writer.update(|s| s.upsert_namespace(ns("a")));
        // A reader holds the snapshot, so the writer changes a copy: still journaled.
        let (_, held) = source.snapshot();
        let (v3, ()) = writer.update(|s| s.upsert_namespace(ns("b")));
        assert_eq!(source.changes(v2, v3), Some(vec![Change::Namespace("b".into())]));
        // Replaced by an earlier copy (what the simulated cluster does between cases): the
        // changes are unknown, so nothing before it can be served incrementally.
        let earlier = Snapshot::clone(&held);
        let (v4, ()) = writer.update(|s| {
            *s = earlier;
            s.upsert_namespace(ns("c"));
        });
        assert_eq!(source.changes(v3, v4), None);
        let (v5, ()) = writer.update(|s| s.remove_namespace("c").map(drop).unwrap_or_default());
        assert_eq!(source.changes(v4, v5), Some(vec![Change::Namespace("c".into())]));
    }
}
