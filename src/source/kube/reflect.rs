//! One resource's list-and-watch loop (what client-go calls a reflector), written here rather
//! than taken from kube-runtime's `watcher` because the agent must see what that hides:
//!
//! - kube-runtime 5's watcher swallows bookmarks and silent re-watches, so a quiet but
//!   healthy watch cannot be told from a dead one; here every bookmark, list and watch that
//!   stays open is proof of health ([`ApiHealth::watch_ok`]).
//! - It relists only on 410 Expired. After an etcd restore the server answers a watch from
//!   the resourceVersion the client holds with 504 "Too large resource version", and the
//!   watcher re-watches from that same resourceVersion for ever, keeping objects that no
//!   longer exist. Here, as in client-go's reflector, 410 relists with `NotOlderThan` the last
//!   resourceVersion (cheap: served from the API server's cache), "too large" — from a watch
//!   or from that list — relists with a consistent read (`resourceVersion` unset), and so
//!   does a watch that keeps failing ([`Options::relist_after`] attempts in a row).
//!
//! A relist is sent as one [`Change::Relisted`] with every object, once the last page is in:
//! the snapshot keeps the last-known objects (and nft the last-known rules) until the whole
//! list has arrived and replaces them at once, never from a partial list.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::Status;
use kube::{Api, Resource as KubeResource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::SourceMetrics;
use super::health::{ApiHealth, unit_jitter};
use super::{Change, Key, Object, Resource};
use crate::model::convert::ConvertError;

/// How the list-and-watch loops behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Objects per list page.
    pub page_size: u32,
    /// Backoff after a failure: from `backoff_min`, doubling to `backoff_max`, each wait
    /// between half and all of it (jittered from `seed`).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Relist after this many failed watch attempts in a row (the resourceVersion itself
    /// may be what fails).
    pub relist_after: u32,
    /// A watch open this long without an error is healthy (before its first event or
    /// bookmark arrives).
    pub settle: Duration,
    /// `timeoutSeconds` of watch requests; no data for this plus 5 s means a dead
    /// connection.
    pub watch_timeout: u32,
    /// While an optional resource (a CRD's) is not served, discovery is asked again after
    /// this plus up to as much again (jittered from `seed`).
    pub discovery_interval: Duration,
    /// Seeds the backoff jitter.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            page_size: 500,
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            relist_after: 5,
            settle: Duration::from_secs(1),
            watch_timeout: 290,
            discovery_interval: Duration::from_secs(30),
            seed: 0,
        }
    }
}

/// How a relist reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListFrom {
    /// A consistent read: the latest state (`resourceVersion` unset).
    Latest,
    /// Anything at least as new as this resourceVersion (`NotOlderThan`).
    NotOlderThan(String),
}

/// Why a relist happens (the `reason` label of `flock_watch_relists_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Initial,
    /// 410: the server no longer has the history from our resourceVersion.
    Expired,
    /// 504 "Too large resource version": the server is behind what we hold (state loss).
    TooLarge,
    /// The watch kept failing.
    Failing,
}

impl Why {
    fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Expired => "expired",
            Self::TooLarge => "too_large",
            Self::Failing => "failing",
        }
    }
}

/// How one watch request ended.
enum WatchEnd {
    /// The server closed it cleanly (its timeout, a restart): watch again.
    Closed,
    /// It failed; watch again after a backoff.
    Failed,
    /// The server closed it at once without sending anything: once can be a restart, twice
    /// in a row is a failure (client-go's "very short watch"). Watch again after a backoff.
    Short,
    /// Its resourceVersion cannot be used: relist.
    Relist(ListFrom, Why),
    /// The resource is not served (404 for an optional one).
    NotServed,
    /// The snapshot side has gone away.
    Stopped,
}

/// Why a reflector's loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The snapshot side has gone away.
    Stopped,
    /// An optional resource answered 404 (its CRD was removed, or is not there yet): the
    /// caller checks discovery again.
    NotServed,
}

/// Converts one kind of object for the snapshot.
pub(super) struct Kind<K> {
    pub(crate) convert: fn(&K) -> Result<Object, ConvertError>,
    pub(crate) key: fn(&K) -> Key,
    /// Whether an update that cannot be converted removes the object's earlier version
    /// (fail closed: a pod flock cannot read is no peer, and a local one is closed), rather
    /// than leaving the earlier version in force.
    pub(crate) drop_unreadable: bool,
    /// The resource is a CRD that may not be installed: a 404 ends the loop
    /// ([`Ended::NotServed`]) instead of being retried as a failure.
    pub(crate) optional: bool,
}

/// One resource's loop.
pub(super) struct Reflector<K: KubeResource + Clone> {
    pub(crate) api: Api<K>,
    pub(crate) resource: Resource,
    pub(crate) kind: Kind<K>,
    pub(crate) tx: mpsc::Sender<(Resource, Change)>,
    pub(crate) health: Arc<ApiHealth>,
    pub(crate) metrics: Arc<dyn SourceMetrics>,
    pub(crate) opts: Options,
    /// A field selector for the list and the watches (`spec.nodeName=…`: this node's pods).
    pub(crate) fields: Option<String>,
}

/// Whether a `Status` is the API server's "Too large resource version" (504 Timeout with the
/// `ResourceVersionTooLarge` cause; older servers only said so in the message).
pub(super) fn too_large(s: &Status) -> bool {
    let cause = s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "ResourceVersionTooLarge"));
    cause || ((s.code == 504 || s.code == 500) && s.message.contains("Too large resource version"))
}

/// Whether a `Status` is 410 Expired/Gone.
pub(super) fn expired(s: &Status) -> bool {
    s.code == 410 || s.reason == "Expired" || s.reason == "Gone"
}

/// A short text for a failed request.
pub(super) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => describe_status(s),
        other => other.to_string(),
    }
}

fn describe_status(s: &Status) -> String {
    format!("{} {}: {}", s.code, s.reason, s.message)
}

/// Exponential backoff with deterministic jitter.
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    seed: u64,
    n: u64,
}

impl Backoff {
    pub(super) fn new(opts: &Options, resource: Resource) -> Self {
        let seed = opts.seed ^ super::health::seed_from(resource.as_str());
        Self { min: opts.backoff_min, max: opts.backoff_max.max(opts.backoff_min), next: opts.backoff_min, seed, n: 0 }
    }

    pub(super) fn next_wait(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        self.n += 1;
        base / 2 + (base / 2).mul_f64(unit_jitter(self.seed, self.n))
    }

    pub(super) fn reset(&mut self) {
        self.next = self.min;
    }
}

impl<K> Reflector<K>
where
    K: KubeResource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// [`Reflector::run`] for a resource that is always served.
    pub(crate) async fn run_until_stopped(self) {
        let _ = self.run().await;
    }

    /// Lists and watches until the snapshot side goes away (or, for an optional resource,
    /// until it is not served).
    pub(crate) async fn run(self) -> Ended {
        let mut backoff = Backoff::new(&self.opts, self.resource);
        let mut from = ListFrom::Latest;
        let mut why = Why::Initial;
        loop {
            // (Re)list until a whole list has arrived.
            let mut rv = loop {
                match self.list(&from).await {
                    Ok((objects, rv)) => {
                        let count = objects.len();
                        if self.tx.send((self.resource, Change::Relisted(objects))).await.is_err() {
                            return Ended::Stopped;
                        }
                        self.ok();
                        backoff.reset();
                        self.metrics.watch_relisted(self.resource.as_str(), why.as_str());
                        if why != Why::Initial {
                            tracing::info!(resource = self.resource.as_str(), objects = count, reason = why.as_str(), "relisted");
                        } else {
                            tracing::debug!(resource = self.resource.as_str(), objects = count, "listed");
                        }
                        break rv;
                    }
                    // Our resourceVersion is unusable for a list too: read the latest.
                    Err(kube::Error::Api(s)) if from != ListFrom::Latest && (too_large(&s) || expired(&s)) => {
                        self.note(&format!("list from the last resourceVersion: {}; relisting from the latest", describe_status(&s)));
                        if too_large(&s) {
                            why = Why::TooLarge;
                        }
                        from = ListFrom::Latest;
                    }
                    Err(kube::Error::Api(s)) if self.not_served(&s) => return Ended::NotServed,
                    Err(e) => {
                        self.fail(&format!("list: {}", describe(&e)));
                        tokio::time::sleep(backoff.next_wait()).await;
                    }
                }
            };
            // Watch until a relist is due.
            let mut failures = 0u32;
            loop {
                let end = self.watch(&mut rv, &mut failures).await;
                match end {
                    WatchEnd::Closed => {}
                    WatchEnd::Failed | WatchEnd::Short => {
                        if failures == 0 {
                            // Healthy since the last failure: start the backoff over.
                            backoff.reset();
                        } else if matches!(end, WatchEnd::Short) {
                            self.fail("watch: closed by the server at once, again");
                        }
                        failures += 1;
                        tokio::time::sleep(backoff.next_wait()).await;
                        if failures >= self.opts.relist_after {
                            tracing::warn!(resource = self.resource.as_str(), failures, "the watch keeps failing; relisting");
                            (from, why) = (ListFrom::NotOlderThan(rv.clone()), Why::Failing);
                            break;
                        }
                    }
                    WatchEnd::Relist(f, w) => {
                        (from, why) = (f, w);
                        break;
                    }
                    WatchEnd::NotServed => return Ended::NotServed,
                    WatchEnd::Stopped => return Ended::Stopped,
                }
            }
        }
    }

    /// Whether a failed request says that an optional resource is not served.
    fn not_served(&self, s: &Status) -> bool {
        self.kind.optional && s.code == 404
    }

    fn ok(&self) {
        if self.health.watch_ok(self.resource).watch_recovered {
            tracing::info!(resource = self.resource.as_str(), "watch healthy again");
            self.metrics.watch_reconnected(self.resource.as_str());
        }
    }

    fn fail(&self, e: &str) {
        if self.health.watch_error(self.resource, e) {
            tracing::warn!(resource = self.resource.as_str(), error = %e, "watch failed; last-known rules stay in force");
        } else {
            tracing::debug!(resource = self.resource.as_str(), error = %e, "watch still failing");
        }
        self.metrics.watch_error(self.resource.as_str());
    }

    fn note(&self, e: &str) {
        tracing::warn!(resource = self.resource.as_str(), "{e}");
        self.health.note(self.resource, e);
    }

    /// Every page of a list, converted, and its resourceVersion.
    async fn list(&self, from: &ListFrom) -> Result<(Vec<Object>, String), kube::Error> {
        let mut lp = ListParams::default().limit(self.opts.page_size);
        if let Some(f) = &self.fields {
            lp = lp.fields(f);
        }
        if let ListFrom::NotOlderThan(rv) = from {
            lp.resource_version = Some(rv.clone());
            lp.version_match = Some(VersionMatch::NotOlderThan);
        }
        let mut objects = Vec::new();
        let mut rv = None;
        loop {
            let page = self.api.list(&lp).await?;
            // Every page reports the first page's resourceVersion.
            if rv.is_none() {
                rv = page.metadata.resource_version.clone().filter(|v| !v.is_empty());
            }
            objects.extend(page.items.iter().filter_map(|o| self.convert(o)));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp.continue_token = Some(token),
                None => break,
            }
        }
        match rv {
            Some(rv) => Ok((objects, rv)),
            None => Err(kube::Error::Api(Box::new(Status::failure("the list has no resourceVersion", "InternalError").with_code(500)))),
        }
    }

    /// Converts an object, logging (then skipping) one the API server should never have stored.
    fn convert(&self, o: &K) -> Option<Object> {
        match (self.kind.convert)(o) {
            Ok(x) => Some(x),
            Err(e) => {
                let object = (self.kind.key)(o);
                tracing::warn!(resource = self.resource.as_str(), ?object, error = %e, "skipping an object that cannot be converted");
                None
            }
        }
    }

    async fn send(&self, c: Change) -> bool {
        self.tx.send((self.resource, c)).await.is_ok()
    }

    /// One watch request from `rv`, followed until it ends; `rv` follows the events.
    async fn watch(&self, rv: &mut String, failures: &mut u32) -> WatchEnd {
        let mut wp = WatchParams::default().timeout(self.opts.watch_timeout);
        if let Some(f) = &self.fields {
            wp = wp.fields(f);
        }
        let stream = match self.api.watch(&wp, rv).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if expired(&s) || too_large(&s) => return self.unusable(&s, rv),
            Err(kube::Error::Api(s)) if self.not_served(&s) => return WatchEnd::NotServed,
            Err(e) => {
                self.fail(&format!("watch: {}", describe(&e)));
                return WatchEnd::Failed;
            }
        };
        let mut stream = stream.boxed();
        let idle = Duration::from_secs(u64::from(self.opts.watch_timeout)) + Duration::from_secs(5);
        let settle = tokio::time::sleep(self.opts.settle);
        tokio::pin!(settle);
        let mut settled = false;
        let mut errored = false;
        loop {
            let item = tokio::select! {
                item = tokio::time::timeout(idle, stream.next()) => item,
                () = &mut settle, if !settled => {
                    // Open without an error for a while: healthy, before any event.
                    settled = true;
                    if !errored {
                        self.proof(failures);
                    }
                    continue;
                }
            };
            let proof = match item {
                Err(_) => {
                    self.fail(&format!("watch: no data for {}s (a dead connection?)", idle.as_secs()));
                    return WatchEnd::Failed;
                }
                Ok(None) if errored => return WatchEnd::Failed,
                Ok(None) if !settled => return WatchEnd::Short,
                Ok(None) => return WatchEnd::Closed,
                Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => {
                    advance(rv, &o);
                    let change = match self.convert(&o) {
                        Some(x) => Some(Change::Apply(Box::new(x))),
                        // An earlier version must not stay in force for an object now unreadable.
                        None if self.kind.drop_unreadable => Some(Change::Delete((self.kind.key)(&o))),
                        None => None,
                    };
                    if let Some(c) = change
                        && !self.send(c).await
                    {
                        return WatchEnd::Stopped;
                    }
                    true
                }
                Ok(Some(Ok(WatchEvent::Deleted(o)))) => {
                    advance(rv, &o);
                    if !self.send(Change::Delete((self.kind.key)(&o))).await {
                        return WatchEnd::Stopped;
                    }
                    true
                }
                Ok(Some(Ok(WatchEvent::Bookmark(b)))) => {
                    if !b.metadata.resource_version.is_empty() {
                        rv.clone_from(&b.metadata.resource_version);
                    }
                    true
                }
                // The server ends the stream after an ERROR event.
                Ok(Some(Ok(WatchEvent::Error(s)))) if expired(&s) || too_large(&s) => return self.unusable(&s, rv),
                Ok(Some(Ok(WatchEvent::Error(s)))) if self.not_served(&s) => return WatchEnd::NotServed,
                Ok(Some(Ok(WatchEvent::Error(s)))) => {
                    self.fail(&format!("watch: {}", describe_status(&s)));
                    return WatchEnd::Failed;
                }
                // An undecodable line or a read error; the stream may go on.
                Ok(Some(Err(e))) => {
                    errored = true;
                    self.fail(&format!("watch: {}", describe(&e)));
                    false
                }
            };
            if proof {
                errored = false;
                settled = true;
                self.proof(failures);
            }
        }
    }

    fn proof(&self, failures: &mut u32) {
        *failures = 0;
        self.ok();
    }

    /// A watch from `rv` was refused because of `rv` itself.
    fn unusable(&self, s: &Status, rv: &str) -> WatchEnd {
        if too_large(s) {
            // The server is behind what we hold: it lost state (an etcd restore). Only a
            // consistent read can tell what exists now.
            self.note(&format!("watch from resourceVersion {rv}: {}; relisting from the latest", describe_status(s)));
            WatchEnd::Relist(ListFrom::Latest, Why::TooLarge)
        } else {
            tracing::info!(resource = self.resource.as_str(), rv, "watch history expired (410); relisting");
            WatchEnd::Relist(ListFrom::NotOlderThan(rv.to_string()), Why::Expired)
        }
    }
}

fn advance<K: KubeResource>(rv: &mut String, o: &K) {
    if let Some(v) = o.meta().resource_version.as_deref().filter(|v| !v.is_empty()) {
        v.clone_into(rv);
    }
}

#[cfg(test)]
mod tests {
    use kube::core::response::{StatusCause, StatusDetails};

    use super::*;

    fn status(code: u16, reason: &str, message: &str, causes: &[&str]) -> Status {
        let mut s = Status::failure(message, reason).with_code(code);
        if !causes.is_empty() {
            s = s.with_details(StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: causes.iter().map(|c| StatusCause { reason: (*c).into(), message: String::new(), field: String::new() }).collect(),
                retry_after_seconds: 1,
            });
        }
        s
    }

    #[test]
    fn classifies_unusable_resource_versions() {
        let real = status(504, "Timeout", "Timeout: Too large resource version: 9, current: 4", &["ResourceVersionTooLarge"]);
        assert!(too_large(&real) && !expired(&real));
        // Servers before the cause existed (1.17) said it only in the message.
        assert!(too_large(&status(500, "InternalError", "Too large resource version: 9, current: 4", &[])));
        assert!(!too_large(&status(504, "Timeout", "the request timed out", &[])));
        assert!(expired(&status(410, "Expired", "too old resource version: 1 (5)", &[])));
        assert!(!expired(&status(500, "InternalError", "boom", &[])));
        assert_eq!(describe_status(&real), "504 Timeout: Timeout: Too large resource version: 9, current: 4");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_resets() {
        let opts = Options { backoff_min: Duration::from_millis(100), backoff_max: Duration::from_millis(800), ..Options::default() };
        let mut b = Backoff::new(&opts, Resource::Pods);
        let waits: Vec<Duration> = (0..6).map(|_| b.next_wait()).collect();
        for (w, base) in waits.iter().zip([100u64, 200, 400, 800, 800, 800]) {
            assert!(*w >= Duration::from_millis(base / 2) && *w <= Duration::from_millis(base), "{waits:?}");
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }
}
