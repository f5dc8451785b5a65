//! The object store: objects by resource, namespace and name; the global `resourceVersion`
//! counter; the bounded event history; and the open watches it feeds.
//!
//! Everything lives behind one mutex, so a write, its `resourceVersion`, its history entry and
//! its delivery to every open watch happen atomically: a watch that starts (replaying history
//! newer than its `resourceVersion`) and registers under the lock can neither miss nor repeat
//! an event. Objects are kept as JSON (`Arc<Stored>`, carrying `kind` and `apiVersion`) in a
//! `BTreeMap` per resource ordered by (namespace, name), which is also the list order and what
//! `continue` tokens point into.
//!
//! A [`Backup`] and [`Store::restore`] model an etcd restore: objects and resourceVersion go
//! back, the history is gone, open watches end.
//!
//! Server-side apply lives in the `apply` submodule.
//!
//! Not modelled: garbage collection of `ownerReferences` children (deleting an owner leaves
//! its dependents), namespace deletion cascading to the namespace's objects, graceful pod
//! deletion (pods without finalizers go at once), admission, validation beyond names, and
//! consistent snapshots across list pages (see [`Store::list`]).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ops::Bound,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};

mod apply;

use crate::{
    meta,
    registry::{Gvr, Registry, ResourceDef, defs_from_crd},
    selector::{FieldSelector, LabelSelector},
    status::ApiError,
};

/// (namespace, name); the namespace is `""` for cluster-scoped objects.
pub(crate) type ObjKey = (String, String);

/// A stored object and its JSON encoding, made once per write and reused by every list, get
/// and watch event that sends it.
#[derive(Debug)]
pub(crate) struct Stored {
    pub value: Value,
    pub json: Bytes,
}

impl Stored {
    pub fn new(value: Value) -> Arc<Self> {
        // Encoding a `Value` does not fail.
        let json = serde_json::to_vec(&value).map(Bytes::from).unwrap_or_else(|_| Bytes::from_static(b"null"));
        Arc::new(Self { value, json })
    }
}

impl std::ops::Deref for Stored {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.value
    }
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The `type` field of a watch event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history.
#[derive(Debug)]
struct StoreEvent {
    rv: u64,
    gvr: Gvr,
    kind: EventType,
    /// The object after the change (for deletions: its last state, with the deletion's rv).
    object: Arc<Stored>,
    /// The object before a modification, to turn it into ADDED/DELETED for selector watches.
    prev: Option<Arc<Stored>>,
}

/// What a watch stream sends next.
#[derive(Debug, Clone)]
pub(crate) enum WatchMsg {
    /// An ADDED, MODIFIED or DELETED event.
    Event(EventType, Arc<Stored>),
    /// A BOOKMARK at this resourceVersion (`initial_events_end` for streaming lists).
    Bookmark { rv: u64, initial_events_end: bool },
    /// An ERROR event carrying a `Status`; the stream ends after it.
    Error(ApiError),
    /// A malformed line (the `garbage` fault).
    Garbage,
}

/// What a watch selects: one resource, optionally one namespace, and selectors.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub def: Arc<ResourceDef>,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The message this watch gets for a change, if any. A modification that moves an object
    /// into (out of) the selection is sent as ADDED (DELETED), as real API servers do.
    fn translate(&self, event: &StoreEvent) -> Option<WatchMsg> {
        if event.gvr.resource != self.def.plural || event.gvr.group != self.def.group || event.gvr.version != self.def.version {
            return None;
        }
        if let Some(ns) = &self.namespace
            && event.object["metadata"]["namespace"].as_str() != Some(ns.as_str())
        {
            return None;
        }
        let now = self.selects(&event.object);
        let kind = match (event.kind, event.prev.as_deref().map(|p| self.selects(p))) {
            (EventType::Modified, Some(false)) if now => EventType::Added,
            (EventType::Modified, Some(true)) if !now => EventType::Deleted,
            (kind, _) if now => kind,
            _ => return None,
        };
        Some(WatchMsg::Event(kind, event.object.clone()))
    }
}

struct Watcher {
    filter: WatchFilter,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

/// Query of a list request.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub items: Vec<Arc<Stored>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// Query of a watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
}

/// A started watch: what to send first, then the live feed (none after an ERROR).
pub(crate) struct WatchStart {
    pub initial: Vec<WatchMsg>,
    pub live: Option<(mpsc::UnboundedReceiver<WatchMsg>, WatchGuard)>,
}

/// Unregisters a watch when its response stream is dropped.
pub(crate) struct WatchGuard {
    store: Arc<Store>,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut state = self.store.lock();
        state.watchers.remove(&self.id);
        state.publish_watch_count();
    }
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The object; `.status` is kept when the resource has a status subresource.
    Main,
    /// Only `.status` (the `/status` subresource).
    Status,
}

/// Who writes: an API request (server rules apply) or a test seeding the store directly
/// (status, uid and timestamps are taken as given, no optimistic concurrency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Api,
    Direct,
}

/// `DeleteOptions.preconditions`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// A server-side apply request.
#[derive(Debug, Clone)]
pub(crate) struct ApplyRequest<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub target: Target,
    pub dry_run: bool,
}

/// The store's objects and resourceVersion at one moment (see [`Store::restore`]).
#[derive(Debug, Clone)]
pub struct Backup {
    rv: u64,
    objects: HashMap<Gvr, BTreeMap<ObjKey, Arc<Stored>>>,
}

impl Backup {
    /// The resourceVersion the backup was taken at.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }
}

/// The store shared by request handlers and the test handle.
pub(crate) struct Store {
    state: Mutex<State>,
}

struct State {
    registry: Registry,
    rv: u64,
    /// Watches from (and continue tokens of) resourceVersions below this are expired.
    compacted: u64,
    objects: HashMap<Gvr, BTreeMap<ObjKey, Arc<Stored>>>,
    history: VecDeque<Arc<StoreEvent>>,
    history_limit: usize,
    watchers: HashMap<u64, Watcher>,
    next_watcher: u64,
    watch_count: watch::Sender<usize>,
}

const CRD_GROUP: &str = "apiextensions.k8s.io";

impl Store {
    /// An empty store with the built-in resources and the given history bound.
    pub fn new(history_limit: usize) -> Arc<Self> {
        let (watch_count, _) = watch::channel(0);
        Arc::new(Self {
            state: Mutex::new(State {
                registry: Registry::builtin(),
                rv: 1,
                compacted: 0,
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                watchers: HashMap::new(),
                next_watcher: 0,
                watch_count,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the registry (for discovery).
    pub fn with_registry<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        f(&self.lock().registry)
    }

    /// The resource served at `group/version/plural`.
    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.lock().registry.get(group, version, plural)
    }

    /// The resource of `apiVersion` + `kind`.
    pub fn resolve_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceDef>> {
        self.lock().registry.by_kind(api_version, kind)
    }

    /// Serves another resource.
    pub fn register(&self, def: ResourceDef) {
        self.lock().registry.register(def);
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the event history: watches and continue tokens from any earlier
    /// resourceVersion get 410 Expired.
    pub fn expire_history(&self) {
        let mut state = self.lock();
        state.rv += 1;
        state.compacted = state.rv;
        state.history.clear();
    }

    /// The objects and resourceVersion now, as an etcd snapshot would keep them.
    pub fn backup(&self) -> Backup {
        let state = self.lock();
        Backup { rv: state.rv, objects: state.objects.clone() }
    }

    /// Puts the store back to `backup`, as an etcd restore does: objects written since
    /// vanish, deleted ones return, and no event tells anyone. The resourceVersion becomes
    /// the backup's plus `bump` (0: it goes backwards; etcdutl's `--bump-revision` with
    /// `--mark-compacted` moves it ahead instead) and the history is gone, so watches from
    /// older resourceVersions get 410 Expired and watches and lists from ones the server has
    /// not reached get 504 Too large resource version. Open watches end (the API server
    /// restarts after a restore). Served resources stay as they are.
    pub fn restore(&self, backup: &Backup, bump: u64) {
        let mut state = self.lock();
        state.objects = backup.objects.clone();
        state.rv = backup.rv.saturating_add(bump);
        state.compacted = state.rv;
        state.history.clear();
        state.watchers.clear();
        state.publish_watch_count();
    }

    /// Number of open watch streams.
    pub fn open_watches(&self) -> usize {
        self.lock().watchers.len()
    }

    /// Number of open watch streams of one resource (by its plural name).
    pub fn open_watches_of(&self, plural: &str) -> usize {
        self.lock().watchers.values().filter(|w| w.filter.def.plural == plural).count()
    }

    /// A receiver of the open-watch count.
    pub fn watch_count(&self) -> watch::Receiver<usize> {
        self.lock().watch_count.subscribe()
    }

    /// Ends every open watch stream.
    pub fn close_watches(&self) {
        let mut state = self.lock();
        state.watchers.clear();
        state.publish_watch_count();
    }

    /// Sends a BOOKMARK at the current resourceVersion to every watch that allows them.
    pub fn send_bookmarks(&self) {
        let mut state = self.lock();
        let rv = state.rv;
        state.watchers.retain(|_, w| !w.bookmarks || w.tx.send(WatchMsg::Bookmark { rv, initial_events_end: false }).is_ok());
        state.publish_watch_count();
    }

    /// Sends a malformed line on every open watch.
    pub fn send_garbage(&self) {
        let mut state = self.lock();
        state.watchers.retain(|_, w| w.tx.send(WatchMsg::Garbage).is_ok());
        state.publish_watch_count();
    }

    /// One object.
    pub fn get(&self, def: &ResourceDef, key: &ObjKey) -> Option<Arc<Stored>> {
        self.lock().objects.get(&def.gvr()).and_then(|m| m.get(key)).cloned()
    }

    /// Every object of a resource (in one namespace, or all), unfiltered.
    pub fn all(&self, def: &ResourceDef, namespace: Option<&str>) -> Vec<Arc<Stored>> {
        let state = self.lock();
        state.scope(def, namespace, None).map(|(_, v)| v.clone()).collect()
    }

    /// One page of a list.
    ///
    /// Pages after the first are read from the current objects after the continue key, not
    /// from a snapshot, while reporting the first page's resourceVersion: a watch from it
    /// replays whatever changed in between, so list + watch still converge. A continue token
    /// older than the retained history is 410 Expired, as on a compacted real server, and so
    /// is one from before a restore that went back past it.
    pub fn list(&self, def: &ResourceDef, namespace: Option<&str>, query: &ListQuery) -> Result<ListPage, ApiError> {
        let state = self.lock();
        let (snapshot_rv, after) = match &query.continue_token {
            Some(token) => {
                if query.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
                    return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
                }
                let (rv, key) = decode_continue(token).ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                // A token from before a restore may also be from the server's future.
                if rv < state.compacted || rv > state.rv {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Some(key))
            }
            None => (state.list_rv(query.resource_version.as_deref(), query.resource_version_match.as_deref())?, None),
        };
        let limit = query.limit.unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut continue_token = None;
        let mut matching =
            state.scope(def, namespace, after.as_ref()).filter(|(_, obj)| query.labels.matches(obj) && query.fields.matches(obj));
        let mut last = None;
        for (key, obj) in matching.by_ref() {
            items.push(obj.clone());
            last = Some(key);
            if items.len() == limit {
                break;
            }
        }
        if items.len() == limit
            && matching.next().is_some()
            && let Some(key) = last
        {
            continue_token = Some(encode_continue(snapshot_rv, key));
        }
        Ok(ListPage { items, resource_version: snapshot_rv, continue_token })
    }

    /// Starts a watch: the initial messages (synthetic ADDED for "" and "0", replayed history
    /// otherwise) and the live feed; or only an ERROR event: 410 Expired for a
    /// resourceVersion older than the history, 504 "Too large resource version" for one the
    /// server has not reached (after a [`Store::restore`]). Errors found once the request is
    /// understood are ERROR events on a 200 stream, as the real server sends them.
    pub fn start_watch(self: &Arc<Self>, filter: WatchFilter, query: &WatchQuery) -> Result<WatchStart, ApiError> {
        let mut state = self.lock();
        let mut initial = Vec::new();
        let rv = query.resource_version.as_deref().filter(|rv| !rv.is_empty());
        if let Some(asked) = rv.map(parse_rv).transpose()?
            && asked > state.rv
        {
            let error = ApiError::too_large_resource_version(asked, state.rv);
            return Ok(WatchStart { initial: vec![WatchMsg::Error(error)], live: None });
        }
        if query.send_initial_events || rv.is_none() || rv == Some("0") {
            for (_, obj) in state.scope(&filter.def, filter.namespace.as_deref(), None) {
                if filter.selects(obj) {
                    initial.push(WatchMsg::Event(EventType::Added, obj.clone()));
                }
            }
            if query.send_initial_events && query.bookmarks {
                initial.push(WatchMsg::Bookmark { rv: state.rv, initial_events_end: true });
            }
        } else {
            let from = parse_rv(rv.unwrap_or_default())?;
            if from < state.compacted {
                let message = format!("too old resource version: {from} ({})", state.compacted);
                return Ok(WatchStart { initial: vec![WatchMsg::Error(ApiError::expired(message))], live: None });
            }
            let start = state.history.partition_point(|e| e.rv <= from);
            initial.extend(state.history.range(start..).filter_map(|e| filter.translate(e)));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.next_watcher += 1;
        let id = state.next_watcher;
        state.watchers.insert(id, Watcher { filter, bookmarks: query.bookmarks, tx });
        state.publish_watch_count();
        Ok(WatchStart { initial, live: Some((rx, WatchGuard { store: self.clone(), id })) })
    }

    /// Creates an object (`POST`, or a direct seed).
    pub fn create(&self, def: &ResourceDef, namespace: Option<&str>, object: Value, mode: Mode, dry_run: bool) -> Result<Value, ApiError> {
        self.lock().create(def, namespace, object, mode, dry_run)
    }

    /// Replaces an object, or the status of one (`PUT`).
    pub fn replace(&self, def: &ResourceDef, key: &ObjKey, object: Value, target: Target, dry_run: bool) -> Result<Value, ApiError> {
        self.lock().update(def, key, object, target, Mode::Api, dry_run)
    }

    /// Patches an object: `f` turns the stored object into the candidate (`PATCH`).
    pub fn patch(
        &self,
        def: &ResourceDef,
        key: &ObjKey,
        target: Target,
        dry_run: bool,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let mut state = self.lock();
        let old = state.object(def, key).ok_or_else(|| ApiError::not_found(def, &key.1))?;
        let candidate = f(&old)?;
        state.update(def, key, candidate, target, Mode::Api, dry_run)
    }

    /// Server-side apply; returns the object and whether it was created.
    pub fn apply(&self, def: &ResourceDef, key: &ObjKey, applied: Value, request: &ApplyRequest<'_>) -> Result<(Value, bool), ApiError> {
        self.lock().server_side_apply(def, key, applied, request)
    }

    /// Creates or replaces an object as given (the test handle's `apply`).
    pub fn put_direct(&self, def: &ResourceDef, object: Value) -> Result<Value, ApiError> {
        let mut state = self.lock();
        let key = state.key_of(def, &object, None)?;
        if state.object(def, &key).is_some() {
            state.update(def, &key, object, Target::Main, Mode::Direct, false)
        } else {
            state.create(def, Some(&key.0), object, Mode::Direct, false)
        }
    }

    /// Deletes an object (`DELETE`): at once, or by setting `deletionTimestamp` while it has
    /// finalizers (it goes when the last finalizer is removed).
    pub fn delete(&self, def: &ResourceDef, key: &ObjKey, pre: &Preconditions, dry_run: bool) -> Result<Value, ApiError> {
        self.lock().delete(def, key, pre, dry_run)
    }

    /// Deletes every selected object (`DELETE` on a collection).
    pub fn delete_collection(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        query: &ListQuery,
        dry_run: bool,
    ) -> Result<Vec<Value>, ApiError> {
        let mut state = self.lock();
        let keys: Vec<ObjKey> = state
            .scope(def, namespace, None)
            .filter(|(_, obj)| query.labels.matches(obj) && query.fields.matches(obj))
            .map(|(key, _)| key.clone())
            .collect();
        keys.iter().map(|key| state.delete(def, key, &Preconditions::default(), dry_run)).collect()
    }

    /// Removes an object at once, finalizers or not (the test handle's `delete`).
    pub fn remove_direct(&self, def: &ResourceDef, key: &ObjKey) -> Option<Value> {
        let mut state = self.lock();
        let old = state.object(def, key)?;
        Some(state.remove(def, key, &old))
    }
}

impl State {
    fn publish_watch_count(&self) {
        let n = self.watchers.len();
        self.watch_count.send_if_modified(|count| std::mem::replace(count, n) != n);
    }

    fn object(&self, def: &ResourceDef, key: &ObjKey) -> Option<Arc<Stored>> {
        self.objects.get(&def.gvr()).and_then(|m| m.get(key)).cloned()
    }

    /// Objects of a resource in key order: in `namespace` (or all), after `after`.
    fn scope<'a>(
        &'a self,
        def: &ResourceDef,
        namespace: Option<&'a str>,
        after: Option<&ObjKey>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Stored>)> + 'a {
        let lower = match (after, namespace) {
            (Some(key), _) => Bound::Excluded(key.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        self.objects
            .get(&def.gvr())
            .into_iter()
            .flat_map(move |m| m.range((lower.clone(), Bound::Unbounded)))
            .take_while(move |(key, _)| namespace.is_none_or(|ns| key.0 == ns))
    }

    /// The resourceVersion a fresh list is served at.
    fn list_rv(&self, rv: Option<&str>, rv_match: Option<&str>) -> Result<u64, ApiError> {
        let rv_match = rv_match.filter(|m| !m.is_empty());
        let Some(rv) = rv.filter(|rv| !rv.is_empty()) else {
            return match rv_match {
                None => Ok(self.rv),
                Some(_) => Err(ApiError::bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")),
            };
        };
        let asked = parse_rv(rv)?;
        match rv_match {
            Some("Exact") if asked == self.rv => Ok(self.rv),
            Some("Exact") if asked > self.rv => Err(ApiError::too_large_resource_version(asked, self.rv)),
            // Past snapshots are not kept.
            Some("Exact") => Err(ApiError::expired(format!("too old resource version: {asked} ({})", self.rv))),
            None | Some("NotOlderThan") if asked > self.rv => Err(ApiError::too_large_resource_version(asked, self.rv)),
            None | Some("NotOlderThan") => Ok(self.rv),
            Some(other) => Err(ApiError::bad_request(format!("unsupported resourceVersionMatch {other:?}"))),
        }
    }

    /// Where an object belongs: (namespace from the path or the object or `default`, name).
    fn key_of(&self, def: &ResourceDef, object: &Value, path_ns: Option<&str>) -> Result<ObjKey, ApiError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            return Err(ApiError::invalid(def, "", "metadata.name: Required value: name or generateName is required"));
        }
        let ns = if def.namespaced {
            path_ns.or(object["metadata"]["namespace"].as_str().filter(|s| !s.is_empty())).unwrap_or("default")
        } else {
            ""
        };
        Ok((ns.to_owned(), name.to_owned()))
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Records a change, feeds the open watches, and bounds the history.
    fn emit(&mut self, def: &ResourceDef, kind: EventType, object: Arc<Stored>, prev: Option<Arc<Stored>>) {
        let event = Arc::new(StoreEvent { rv: self.rv, gvr: def.gvr(), kind, object, prev });
        self.watchers.retain(|_, w| match w.filter.translate(&event) {
            Some(msg) => w.tx.send(msg).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.publish_watch_count();
        self.history.push_back(event);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = self.compacted.max(old.rv);
            }
        }
    }

    fn insert(&mut self, def: &ResourceDef, key: ObjKey, object: Value, kind: EventType, prev: Option<Arc<Stored>>) -> Value {
        if def.group == CRD_GROUP && def.plural == "customresourcedefinitions" {
            for crd_def in defs_from_crd(&object) {
                self.registry.register(crd_def);
            }
        }
        let object = Stored::new(object);
        self.objects.entry(def.gvr()).or_default().insert(key, object.clone());
        let out = object.value.clone();
        self.emit(def, kind, object, prev);
        out
    }

    /// What a real server does when a CRD object goes: its custom resources are deleted
    /// (each with its DELETED event), then its kinds are no longer served (requests get 404,
    /// discovery no longer lists them) and the open watches of those kinds end.
    fn uninstall(&mut self, crd: &Value) {
        for def in defs_from_crd(crd) {
            let gvr = def.gvr();
            let objects: Vec<(ObjKey, Arc<Stored>)> =
                self.objects.get(&gvr).map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
            for (key, old) in objects {
                self.remove(&def, &key, &old);
            }
            self.objects.remove(&gvr);
            self.registry.unregister(&gvr);
            self.watchers.retain(|_, w| w.filter.def.gvr() != gvr);
            self.publish_watch_count();
        }
    }

    fn remove(&mut self, def: &ResourceDef, key: &ObjKey, old: &Arc<Stored>) -> Value {
        if def.group == CRD_GROUP && def.plural == "customresourcedefinitions" {
            self.uninstall(old);
        }
        let mut last = old.value.clone();
        let rv = self.next_rv();
        set_meta(&mut last, "resourceVersion", rv.to_string().into());
        if let Some(map) = self.objects.get_mut(&def.gvr()) {
            map.remove(key);
        }
        self.emit(def, EventType::Deleted, Stored::new(last.clone()), Some(old.clone()));
        last
    }

    fn create(
        &mut self,
        def: &ResourceDef,
        path_ns: Option<&str>,
        mut object: Value,
        mode: Mode,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        check_type(def, &mut object)?;
        if def.namespaced {
            let object_ns = object["metadata"]["namespace"].as_str().filter(|s| !s.is_empty());
            if let (Some(path), Some(obj)) = (path_ns, object_ns)
                && path != obj
            {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
            }
            let ns = path_ns.or(object_ns).unwrap_or("default").to_owned();
            set_meta(&mut object, "namespace", ns.into());
        } else if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        let existing_name = object["metadata"]["name"].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        let name = match existing_name {
            Some(name) => name,
            None => {
                let Some(prefix) = object["metadata"]["generateName"].as_str().filter(|s| !s.is_empty()).map(str::to_owned) else {
                    return Err(ApiError::invalid(def, "", "metadata.name: Required value: name or generateName is required"));
                };
                let ns = object["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
                let mut name = format!("{prefix}{}", meta::name_suffix());
                while self.object(def, &(ns.clone(), name.clone())).is_some() {
                    name = format!("{prefix}{}", meta::name_suffix());
                }
                set_meta(&mut object, "name", name.clone().into());
                name
            }
        };
        if name.contains('/') || name.contains('%') {
            return Err(ApiError::invalid(def, &name, "metadata.name: Invalid value: may not contain '/' or '%'"));
        }
        let key = (object["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(), name.clone());
        if self.object(def, &key).is_some() {
            return Err(ApiError::already_exists(def, &name));
        }
        let given = |object: &Value, field: &str| mode == Mode::Direct && !object["metadata"][field].is_null();
        if !given(&object, "uid") {
            set_meta(&mut object, "uid", meta::new_uid().into());
        }
        if !given(&object, "creationTimestamp") {
            set_meta(&mut object, "creationTimestamp", meta::now_rfc3339().into());
        }
        if !given(&object, "generation") {
            set_meta(&mut object, "generation", 1.into());
        }
        if mode == Mode::Api {
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("deletionTimestamp");
                meta.remove("deletionGracePeriodSeconds");
            }
            if def.status_subresource
                && let Some(map) = object.as_object_mut()
            {
                map.remove("status");
            }
        }
        default_status(def, &mut object, mode);
        if dry_run {
            return Ok(object);
        }
        let rv = self.next_rv();
        set_meta(&mut object, "resourceVersion", rv.to_string().into());
        Ok(self.insert(def, key, object, EventType::Added, None))
    }

    fn update(
        &mut self,
        def: &ResourceDef,
        key: &ObjKey,
        mut candidate: Value,
        target: Target,
        mode: Mode,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = self.object(def, key).ok_or_else(|| ApiError::not_found(def, &key.1))?;
        check_type(def, &mut candidate)?;
        check_identity(def, key, &mut candidate)?;
        if mode == Mode::Api {
            let asked = candidate["metadata"]["resourceVersion"].as_str().unwrap_or_default();
            if !asked.is_empty() && Some(asked) != old["metadata"]["resourceVersion"].as_str() {
                return Err(ApiError::conflict(
                    def,
                    &key.1,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
        }
        let new = match target {
            Target::Main => {
                keep_server_fields(&old, &mut candidate, def, mode);
                candidate
            }
            Target::Status => {
                let mut new = old.value.clone();
                if let Some(map) = new.as_object_mut() {
                    match candidate.get("status") {
                        Some(status) => map.insert("status".into(), status.clone()),
                        None => map.remove("status"),
                    };
                }
                if let Some(managed) = candidate["metadata"].get("managedFields") {
                    set_meta(&mut new, "managedFields", managed.clone());
                }
                new
            }
        };
        self.commit(def, key, &old, new, dry_run)
    }

    /// Stores the new state of an existing object: bumps `generation` when anything outside
    /// metadata and status changed, skips no-op writes (no new resourceVersion, no event),
    /// and deletes an object being deleted once its last finalizer is gone.
    fn commit(&mut self, def: &ResourceDef, key: &ObjKey, old: &Arc<Stored>, mut new: Value, dry_run: bool) -> Result<Value, ApiError> {
        set_meta(&mut new, "resourceVersion", old["metadata"]["resourceVersion"].clone());
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        let bump = i64::from(!same_outside_meta_and_status(&new, old));
        set_meta(&mut new, "generation", (generation + bump).into());
        if new == old.value {
            return Ok(new);
        }
        let finalized = new["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if !new["metadata"]["deletionTimestamp"].is_null() && finalized {
            if dry_run {
                return Ok(new);
            }
            let rv = self.next_rv();
            set_meta(&mut new, "resourceVersion", rv.to_string().into());
            if let Some(map) = self.objects.get_mut(&def.gvr()) {
                map.remove(key);
            }
            self.emit(def, EventType::Deleted, Stored::new(new.clone()), Some(old.clone()));
            return Ok(new);
        }
        if dry_run {
            return Ok(new);
        }
        let rv = self.next_rv();
        set_meta(&mut new, "resourceVersion", rv.to_string().into());
        Ok(self.insert(def, key.clone(), new, EventType::Modified, Some(old.clone())))
    }

    fn delete(&mut self, def: &ResourceDef, key: &ObjKey, pre: &Preconditions, dry_run: bool) -> Result<Value, ApiError> {
        let old = self.object(def, key).ok_or_else(|| ApiError::not_found(def, &key.1))?;
        for (field, wanted, label) in [("uid", &pre.uid, "UID"), ("resourceVersion", &pre.resource_version, "ResourceVersion")] {
            let actual = old["metadata"][field].as_str().unwrap_or_default();
            if let Some(wanted) = wanted
                && wanted != actual
            {
                let why = format!("Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}");
                return Err(ApiError::conflict(def, &key.1, &why));
            }
        }
        let has_finalizers = old["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if !old["metadata"]["deletionTimestamp"].is_null() {
                return Ok(old.value.clone());
            }
            let mut new = old.value.clone();
            set_meta(&mut new, "deletionTimestamp", meta::now_rfc3339().into());
            set_meta(&mut new, "deletionGracePeriodSeconds", 0.into());
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            set_meta(&mut new, "generation", (generation + 1).into());
            if dry_run {
                return Ok(new);
            }
            let rv = self.next_rv();
            set_meta(&mut new, "resourceVersion", rv.to_string().into());
            return Ok(self.insert(def, key.clone(), new, EventType::Modified, Some(old)));
        }
        if dry_run {
            return Ok(old.value.clone());
        }
        Ok(self.remove(def, key, &old))
    }
}

/// Checks (and fills in) `apiVersion` and `kind`, and that `metadata` is an object.
fn check_type(def: &ResourceDef, object: &mut Value) -> Result<(), ApiError> {
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    for (field, want) in [("apiVersion", def.api_version()), ("kind", def.kind.clone())] {
        match map.get(field).and_then(Value::as_str) {
            Some(v) if v == want => {}
            Some(v) if !v.is_empty() => {
                return Err(ApiError::bad_request(format!("{field} {v:?} does not match the resource ({want:?})")));
            }
            _ => {
                map.insert(field.to_owned(), want.into());
            }
        }
    }
    match map.get("metadata") {
        None | Some(Value::Null) => {
            map.insert("metadata".into(), Value::Object(Map::new()));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
    }
    Ok(())
}

/// Checks that the body names the object of the URL, filling in name and namespace.
fn check_identity(def: &ResourceDef, key: &ObjKey, object: &mut Value) -> Result<(), ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    if !name.is_empty() && name != key.1 {
        return Err(ApiError::bad_request(format!("the name of the object ({name}) does not match the name on the URL ({})", key.1)));
    }
    set_meta(object, "name", key.1.clone().into());
    if def.namespaced {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or_default();
        if !ns.is_empty() && ns != key.0 {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        set_meta(object, "namespace", key.0.clone().into());
    } else if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    Ok(())
}

/// Carries server-owned fields of the stored object into a replacement.
fn keep_server_fields(old: &Value, new: &mut Value, def: &ResourceDef, mode: Mode) {
    let fields: &[&str] = match mode {
        Mode::Api => &["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"],
        Mode::Direct => &[],
    };
    for field in fields {
        match old["metadata"].get(*field) {
            Some(v) => set_meta(new, field, v.clone()),
            None => {
                if let Some(meta) = new["metadata"].as_object_mut() {
                    meta.remove(*field);
                }
            }
        }
    }
    for field in ["uid", "creationTimestamp", "managedFields"] {
        if new["metadata"].get(field).is_none()
            && let Some(v) = old["metadata"].get(field)
        {
            set_meta(new, field, v.clone());
        }
    }
    if mode == Mode::Api
        && def.status_subresource
        && let Some(map) = new.as_object_mut()
    {
        match old.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
    }
}

/// Defaults some built-in kinds get from their API server strategy.
fn default_status(def: &ResourceDef, object: &mut Value, mode: Mode) {
    let default = match (def.group.as_str(), def.plural.as_str()) {
        ("", "namespaces") => json!({"phase": "Active"}),
        ("", "pods") if mode == Mode::Api => json!({"phase": "Pending"}),
        (CRD_GROUP, "customresourcedefinitions") => {
            let now = meta::now_rfc3339();
            let stored: Vec<Value> = object["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .map(|v| v["name"].clone())
                .collect();
            json!({
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                ],
                "acceptedNames": object["spec"]["names"].clone(),
                "storedVersions": stored,
            })
        }
        _ => return,
    };
    if let Some(map) = object.as_object_mut()
        && map.get("status").is_none_or(Value::is_null)
    {
        map.insert("status".into(), default);
    }
}

/// Whether two objects agree on everything but `metadata` and `status`.
fn same_outside_meta_and_status(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    let rest = |m: &Map<String, Value>| m.iter().filter(|(k, _)| *k != "metadata" && *k != "status").count();
    rest(a) == rest(b) && a.iter().filter(|(k, _)| *k != "metadata" && *k != "status").all(|(k, v)| b.get(k) == Some(v))
}

/// Sets `metadata.<field>`, creating `metadata` if needed.
pub(crate) fn set_meta(object: &mut Value, field: &str, value: Value) {
    let Some(map) = object.as_object_mut() else { return };
    let meta = map.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(field.to_owned(), value);
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))
}

/// `<rv>.<hex namespace>.<hex name>`: opaque to clients, URL-safe.
fn encode_continue(rv: u64, key: &ObjKey) -> String {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{rv}.{}.{}", hex(&key.0), hex(&key.1))
}

fn decode_continue(token: &str) -> Option<(u64, ObjKey)> {
    let mut parts = token.split('.');
    let rv = parts.next()?.parse().ok()?;
    let unhex = |s: &str| -> Option<String> {
        if !s.len().is_multiple_of(2) {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
        String::from_utf8(bytes?).ok()
    };
    let ns = unhex(parts.next()?)?;
    let name = unhex(parts.next()?)?;
    parts.next().is_none().then_some((rv, (ns, name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object_key(object: &Value) -> ObjKey {
        let meta = &object["metadata"];
        (meta["namespace"].as_str().unwrap_or_default().to_owned(), meta["name"].as_str().unwrap_or_default().to_owned())
    }

    fn pods(store: &Store) -> Arc<ResourceDef> {
        store.resolve("", "v1", "pods").unwrap()
    }

    fn pod(ns: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("kube-system".to_owned(), "coredns-x.y".to_owned());
        assert_eq!(decode_continue(&encode_continue(42, &key)), Some((42, key)));
        assert_eq!(decode_continue("nonsense"), None);
        assert_eq!(decode_continue("1.zz.00"), None);
    }

    #[test]
    fn create_update_generation_and_noop() {
        let store = Store::new(100);
        let def = pods(&store);
        let created = store.create(&def, Some("a"), pod("a", "p"), Mode::Api, false).unwrap();
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(created["status"]["phase"], "Pending");
        let rv = store.resource_version();
        let key = ("a".to_owned(), "p".to_owned());
        // Same content: no new resourceVersion.
        let same = store.replace(&def, &key, created.clone(), Target::Main, false).unwrap();
        assert_eq!(store.resource_version(), rv);
        assert_eq!(same["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);
        // Label change: new rv, same generation.
        let mut labelled = created.clone();
        labelled["metadata"]["labels"] = json!({"x": "y"});
        let labelled = store.replace(&def, &key, labelled, Target::Main, false).unwrap();
        assert_eq!(labelled["metadata"]["generation"], 1);
        assert_eq!(store.resource_version(), rv + 1);
        // Spec change: generation bumps; stale rv conflicts.
        let mut spec = labelled.clone();
        spec["spec"]["nodeName"] = "n2".into();
        assert_eq!(store.replace(&def, &key, spec.clone(), Target::Main, false).unwrap()["metadata"]["generation"], 2);
        assert_eq!(store.replace(&def, &key, spec, Target::Main, false).unwrap_err().code, 409);
    }

    fn cnp_crd() -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "clusternetworkpolicies.policy.networking.k8s.io"},
               "spec": {"group": "policy.networking.k8s.io", "scope": "Cluster",
                        "names": {"kind": "ClusterNetworkPolicy", "plural": "clusternetworkpolicies"},
                        "versions": [{"name": "v1alpha2", "served": true, "storage": true, "subresources": {"status": {}},
                                      "schema": {"openAPIV3Schema": {"properties": {"status": {"properties": {"conditions": {
                                          "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}}}}}]}})
    }

    #[test]
    fn deleting_a_crd_deletes_its_objects_and_stops_serving_them() {
        let store = Store::new(100);
        let crds = store.resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions").unwrap();
        store.create(&crds, None, cnp_crd(), Mode::Api, false).unwrap();
        let def = store.resolve("policy.networking.k8s.io", "v1alpha2", "clusternetworkpolicies").unwrap();
        let cnp = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}});
        store.create(&def, None, cnp, Mode::Api, false).unwrap();
        let filter = WatchFilter { def: def.clone(), namespace: None, labels: LabelSelector::default(), fields: FieldSelector::default() };
        let rv = store.resource_version();
        let WatchStart { live: Some((mut rx, _guard)), .. } =
            store.start_watch(filter, &WatchQuery { resource_version: Some(rv.to_string()), ..WatchQuery::default() }).unwrap()
        else {
            panic!("no watch")
        };
        let key = (String::new(), "clusternetworkpolicies.policy.networking.k8s.io".to_owned());
        store.delete(&crds, &key, &Preconditions::default(), false).unwrap();
        assert!(matches!(rx.try_recv(), Ok(WatchMsg::Event(EventType::Deleted, o)) if o["metadata"]["name"] == "p"));
        // The watch ended, and nothing of the kind is served any more.
        assert!(matches!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
        assert!(store.resolve("policy.networking.k8s.io", "v1alpha2", "clusternetworkpolicies").is_none());
        assert!(store.with_registry(|r| r.resource_list("policy.networking.k8s.io", "v1alpha2")).is_none());
        // Installed again: served again, empty.
        store.create(&crds, None, cnp_crd(), Mode::Api, false).unwrap();
        assert!(store.all(&def, None).is_empty());
    }

    #[test]
    fn server_side_apply_merges_list_map_entries_by_key() {
        let store = Store::new(100);
        let crds = store.resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions").unwrap();
        store.create(&crds, None, cnp_crd(), Mode::Api, false).unwrap();
        let def = store.resolve("policy.networking.k8s.io", "v1alpha2", "clusternetworkpolicies").unwrap();
        let cnp = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}});
        store.create(&def, None, cnp, Mode::Api, false).unwrap();
        let key = (String::new(), "p".to_owned());
        let condition = |manager: &str, t: &str, status: &str| {
            let applied = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"},
                                 "status": {"conditions": [{"type": t, "status": status}]}});
            let req = ApplyRequest { manager, force: false, target: Target::Status, dry_run: false };
            store.apply(&def, &key, applied, &req)
        };
        condition("other", "other.dev/Accepted", "True").unwrap();
        condition("flock", "flock.dev/Enforced", "True").unwrap();
        let (obj, _) = condition("flock", "flock.dev/Enforced", "False").unwrap();
        let conditions = obj["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2, "{obj}");
        assert!(conditions.iter().any(|c| c["type"] == "other.dev/Accepted" && c["status"] == "True"));
        assert!(conditions.iter().any(|c| c["type"] == "flock.dev/Enforced" && c["status"] == "False"));
        // Another manager's entry is its own: changing it conflicts.
        assert_eq!(condition("flock", "other.dev/Accepted", "False").unwrap_err().code, 409);
        // An entry its manager no longer applies is gone, the others' stay.
        let (obj, _) = condition("flock", "flock.dev/Other", "True").unwrap();
        let types: Vec<&str> = obj["status"]["conditions"].as_array().unwrap().iter().filter_map(|c| c["type"].as_str()).collect();
        assert_eq!(types, ["flock.dev/Other", "other.dev/Accepted"], "{obj}");
    }

    #[test]
    fn finalizers_delay_deletion() {
        let store = Store::new(100);
        let def = pods(&store);
        let mut obj = pod("a", "p");
        obj["metadata"]["finalizers"] = json!(["flock.dev/cleanup"]);
        store.create(&def, Some("a"), obj, Mode::Api, false).unwrap();
        let key = ("a".to_owned(), "p".to_owned());
        let deleting = store.delete(&def, &key, &Preconditions::default(), false).unwrap();
        assert!(deleting["metadata"]["deletionTimestamp"].is_string());
        assert!(store.get(&def, &key).is_some());
        store
            .patch(&def, &key, Target::Main, false, |old| {
                let mut new = old.clone();
                new["metadata"]["finalizers"] = json!([]);
                Ok(new)
            })
            .unwrap();
        assert!(store.get(&def, &key).is_none());
    }

    fn watch_from(store: &Arc<Store>, rv: u64) -> WatchStart {
        let filter = WatchFilter { def: pods(store), namespace: None, labels: LabelSelector::default(), fields: FieldSelector::default() };
        let query = WatchQuery { resource_version: Some(rv.to_string()), bookmarks: true, ..Default::default() };
        store.start_watch(filter, &query).unwrap()
    }

    fn error_of(start: &WatchStart) -> Option<(u16, &'static str)> {
        match start.initial.as_slice() {
            [WatchMsg::Error(e)] if start.live.is_none() => Some((e.code, e.reason)),
            _ => None,
        }
    }

    #[test]
    fn restore_loses_state_and_resource_versions_go_back() {
        let store = Store::new(100);
        let def = pods(&store);
        store.put_direct(&def, pod("a", "kept")).unwrap();
        store.put_direct(&def, pod("a", "deleted-later")).unwrap();
        let backup = store.backup();
        store.put_direct(&def, pod("a", "created-later")).unwrap();
        store.remove_direct(&def, &("a".into(), "deleted-later".into())).unwrap();
        let seen = store.resource_version();
        let open = watch_from(&store, seen);
        assert_eq!(store.open_watches(), 1);

        store.restore(&backup, 0);
        assert_eq!(store.open_watches(), 0, "a restore ends open watches");
        drop(open);
        assert_eq!(store.resource_version(), backup.resource_version());
        let names: Vec<String> = store.all(&def, None).iter().map(|o| object_key(o).1).collect();
        assert_eq!(names, ["deleted-later", "kept"]);
        // What clients hold is now in the server's future; older history is gone.
        assert_eq!(error_of(&watch_from(&store, seen)), Some((504, "Timeout")));
        assert_eq!(error_of(&watch_from(&store, backup.resource_version() - 1)), Some((410, "Expired")));
        assert_eq!(error_of(&watch_from(&store, backup.resource_version())), None);
        let future = ListQuery { resource_version: Some(seen.to_string()), ..Default::default() };
        assert_eq!(store.list(&def, None, &future).unwrap_err().reason, "Timeout");
        let stale =
            ListQuery { limit: Some(1), continue_token: Some(encode_continue(seen, &("a".into(), "a".into()))), ..Default::default() };
        assert_eq!(store.list(&def, None, &stale).unwrap_err().code, 410);
        let consistent = store.list(&def, None, &ListQuery::default()).unwrap();
        assert_eq!(consistent.resource_version, backup.resource_version());
        // New writes reuse resourceVersions clients have seen before.
        store.put_direct(&def, pod("a", "new")).unwrap();
        assert_eq!(store.resource_version(), backup.resource_version() + 1);

        // A bumped restore moves past everything: every older watch is 410.
        store.restore(&backup, 1000);
        assert_eq!(store.resource_version(), backup.resource_version() + 1000);
        assert_eq!(error_of(&watch_from(&store, seen)), Some((410, "Expired")));
        assert_eq!(store.all(&def, None).len(), 2);
    }

    #[test]
    fn paginated_list_and_namespaces() {
        let store = Store::new(100);
        let def = pods(&store);
        for ns in ["a", "b"] {
            for i in 0..5 {
                store.put_direct(&def, pod(ns, &format!("p{i}"))).unwrap();
            }
        }
        let query = ListQuery { limit: Some(3), ..Default::default() };
        let mut names = Vec::new();
        let mut query = query;
        loop {
            let page = store.list(&def, None, &query).unwrap();
            names.extend(page.items.iter().map(|o| object_key(o)));
            match page.continue_token {
                Some(token) => query.continue_token = Some(token),
                None => break,
            }
        }
        assert_eq!(names.len(), 10);
        assert!(names.windows(2).all(|w| w[0] < w[1]));
        let only_b = store.list(&def, Some("b"), &ListQuery::default()).unwrap();
        assert_eq!(only_b.items.len(), 5);
        store.expire_history();
        let page = store.list(&def, None, &ListQuery { limit: Some(3), ..Default::default() }).unwrap();
        assert!(page.continue_token.is_some());
        let stale =
            ListQuery { limit: Some(3), continue_token: Some(encode_continue(1, &("a".into(), "p0".into()))), ..Default::default() };
        assert_eq!(store.list(&def, None, &stale).unwrap_err().code, 410);
    }
}
