//! Telling flock's removal from a restart, and what the agent undoes on its node when flock
//! is removed.
//!
//! An agent that stops keeps its table, routes and devices on purpose: it is being restarted
//! or upgraded, and the next agent adopts them (pods stay isolated in between). flock is being
//! *removed* when what runs the agent goes away: its DaemonSet is deleted (`helm uninstall`,
//! `kubectl delete -k deploy/…`) or its namespace is. The agent watches both from its start
//! ([`RemovalWatch`]): a watch that is already open keeps delivering after an uninstall has
//! deleted the agent's RBAC, so the deletion is seen even when nothing can be asked any more.
//! At stop it asks once more ([`RemovalWatch::verdict`]) and [`decide`]s: a DaemonSet that is
//! there again (deleted and recreated) is a restart; one the agent never saw is not a removal
//! (a wrong name must never wipe a node); when nothing can be told, the rules stay.
//!
//! On removal ([`undo_node`]): the table, flock's routes and VXLAN devices and the DNS
//! proxy's policy routing go at once; the CNI config and flock-cni stay while the node has pods
//! flock-cni wired (the runtime's DEL of each still needs them), marked so that flock-cni's
//! DEL of the last one removes them ([`flock_cni::removal`]). With no such pod, the agent
//! removes them itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::watch;

use crate::apply::Backend;
use crate::apply::kernel::NftCli;
use crate::netns::Netns;

/// What runs this agent: the DaemonSet and its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovalOptions {
    pub namespace: String,
    pub daemonset: String,
    /// The node's CNI plugin directory (where flock-cni was installed).
    pub cni_bin_dir: PathBuf,
}

/// What a watch last showed of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Seen {
    /// Not listed yet.
    #[default]
    Unknown,
    Present,
    /// There, with a deletion timestamp.
    Deleting,
    /// Listed or watched away.
    Gone,
}

/// What the watches showed of the DaemonSet and the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    pub daemonset: Seen,
    /// The DaemonSet was seen present (or deleting) at least once.
    pub daemonset_known: bool,
    pub namespace: Seen,
    pub namespace_known: bool,
}

/// Removal or restart, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Restart(String),
    Removal(String),
}

/// Decides from what the watches showed and what a last look (`None`: no answer) found of
/// the DaemonSet (`fresh`) and its namespace (`fresh_ns`).
pub fn decide(o: &Observed, fresh: Option<Seen>, fresh_ns: Option<Seen>, opts: &RemovalOptions) -> Verdict {
    let (ns, ds) = (&opts.namespace, format!("{}/{}", opts.namespace, opts.daemonset));
    let ns_known = o.namespace_known || matches!(fresh_ns, Some(Seen::Present | Seen::Deleting));
    for seen in [Some(o.namespace), fresh_ns].into_iter().flatten() {
        if seen == Seen::Deleting || (seen == Seen::Gone && ns_known) {
            return Verdict::Removal(format!("namespace {ns} is being deleted"));
        }
    }
    match fresh {
        Some(Seen::Deleting) => return Verdict::Removal(format!("DaemonSet {ds} is being deleted")),
        Some(Seen::Gone) if o.daemonset_known => return Verdict::Removal(format!("DaemonSet {ds} was deleted")),
        // Deleted and made again (or never gone): its next pod takes the node over.
        Some(Seen::Present) => return Verdict::Restart(format!("DaemonSet {ds} is in place")),
        _ => {}
    }
    match o.daemonset {
        Seen::Deleting => Verdict::Removal(format!("DaemonSet {ds} is being deleted")),
        Seen::Gone if o.daemonset_known => Verdict::Removal(format!("DaemonSet {ds} was deleted")),
        Seen::Gone | Seen::Unknown if !o.daemonset_known => {
            Verdict::Restart(format!("DaemonSet {ds} was never seen: a removal cannot be told, the rules stay"))
        }
        _ => Verdict::Restart(format!("DaemonSet {ds} is in place as last seen (it cannot be asked now)")),
    }
}

/// Watches the agent's DaemonSet and namespace.
pub struct RemovalWatch {
    observed: watch::Receiver<Observed>,
    api: Api<DaemonSet>,
    namespaces: Api<Namespace>,
    opts: RemovalOptions,
}

impl RemovalWatch {
    /// Starts both watches (they end with `stop`).
    pub fn spawn(client: Client, opts: RemovalOptions, stop: watch::Receiver<bool>) -> Self {
        let (tx, observed) = watch::channel(Observed::default());
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &opts.namespace);
        let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let ds_feed = follow(api.clone(), by_name(&opts.daemonset), tx.clone(), |o, seen| {
            o.daemonset = seen;
            o.daemonset_known |= matches!(seen, Seen::Present | Seen::Deleting);
        });
        let namespaces = Api::<Namespace>::all(client);
        let ns_feed = follow(namespaces.clone(), by_name(&opts.namespace), tx, |o, seen| {
            o.namespace = seen;
            o.namespace_known |= matches!(seen, Seen::Present | Seen::Deleting);
        });
        for feed in [ds_feed, ns_feed] {
            let mut stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = feed => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
            });
        }
        Self { observed, api, namespaces, opts }
    }

    /// What the watches showed so far.
    pub fn observed(&self) -> Observed {
        *self.observed.borrow()
    }

    /// Removal or restart, now: the watches, then one last look at the DaemonSet and the
    /// namespace (at most `timeout`; the watch may not have delivered the deletion that stops
    /// the agent yet).
    pub async fn verdict(&self, timeout: Duration) -> Verdict {
        let (ds, ns) = tokio::join!(look(&self.api, &self.opts.daemonset, timeout), look(&self.namespaces, &self.opts.namespace, timeout));
        decide(&self.observed(), ds, ns, &self.opts)
    }
}

/// One object by name, now: `None` when it cannot be told (an error, no answer in time).
async fn look<K>(api: &Api<K>, name: &str, timeout: Duration) -> Option<Seen>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Ok(Ok(Some(o))) => Some(seen_of(&o)),
        Ok(Ok(None)) => Some(Seen::Gone),
        Ok(Err(e)) => {
            tracing::info!(error = %e, name, "cannot look at what runs the agent; deciding from what the watch saw");
            None
        }
        Err(_) => None,
    }
}

fn seen_of<K: Resource>(o: &K) -> Seen {
    if o.meta().deletion_timestamp.is_some() { Seen::Deleting } else { Seen::Present }
}

/// Follows one object by name into `tx` through `set`.
fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    tx: watch::Sender<Observed>,
    set: fn(&mut Observed, Seen),
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    Box::pin(async move {
        let kind = K::kind(&K::DynamicType::default()).to_string();
        let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
        // Whether the list under way showed the object.
        let mut listed = false;
        while let Some(event) = events.next().await {
            let seen = match event {
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(watcher::Event::InitApply(o)) => {
                    listed = true;
                    seen_of(&o)
                }
                Ok(watcher::Event::InitDone) if listed => continue,
                Ok(watcher::Event::InitDone) => Seen::Gone,
                Ok(watcher::Event::Apply(o)) => seen_of(&o),
                Ok(watcher::Event::Delete(_)) => Seen::Gone,
                Err(e) => {
                    tracing::debug!(error = %e, "watching the agent's {kind}");
                    continue;
                }
            };
            tx.send_modify(|o| set(o, seen));
        }
    })
}

/// What flock left on the node, for [`undo_node`].
#[derive(Debug, Clone)]
pub struct Leftovers {
    pub netns: Netns,
    pub nft: PathBuf,
    pub dns: Option<crate::dns_proxy::DnsConfig>,
    /// The CNI config flock-agent wrote.
    pub cni_conf: Option<PathBuf>,
    pub cni_bin_dir: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub spool_dir: PathBuf,
    pub socket: PathBuf,
}

/// What [`undo_node`] removed (and could not).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Undone {
    pub table: bool,
    pub routes: usize,
    pub devices: usize,
    pub dns_routing: usize,
    /// Pods flock-cni wired that are still on the node (the CNI config stays, marked).
    pub pods_left: Option<usize>,
    /// Files and directories removed.
    pub removed: Vec<PathBuf>,
    pub errors: Vec<String>,
}

/// Removes flock from this node (see the module docs). Every step is tried; what failed is
/// in [`Undone::errors`].
pub async fn undo_node(l: &Leftovers) -> Undone {
    let mut u = Undone::default();
    if let Some(dns) = &l.dns {
        match crate::dns_proxy::remove_policy_routing(&l.netns, dns).await {
            Ok(n) => u.dns_routing = n,
            Err(e) => u.errors.push(e.to_string()),
        }
    }
    match crate::agent::routes::remove_all(&l.netns).await {
        Ok((routes, devices)) => (u.routes, u.devices) = (routes, devices),
        Err(e) => u.errors.push(e.to_string()),
    }
    let mut nft = NftCli::new(l.netns.clone()).with_program(&l.nft);
    let table = tokio::task::spawn_blocking(move || match nft.list_table() {
        Ok(Some(_)) => nft.run(&format!("delete table {} {}\n", crate::render::names::FAMILY, crate::render::names::TABLE)).map(|()| true),
        Ok(None) => Ok(false),
        Err(e) => Err(e),
    })
    .await;
    match table {
        Ok(Ok(t)) => u.table = t,
        Ok(Err(e)) => u.errors.push(e.to_string()),
        Err(e) => u.errors.push(format!("deleting the table: {e}")),
    }
    let cni = l.clone();
    match tokio::task::spawn_blocking(move || undo_cni(&cni)).await {
        Ok(Ok((left, removed))) => (u.pods_left, u.removed) = (left, removed),
        Ok(Err(e)) => u.errors.push(e),
        Err(e) => u.errors.push(format!("removing the CNI config: {e}")),
    }
    u
}

/// The CNI side: with pods flock-cni wired still on the node (or unknown), marks the config
/// for flock-cni; with none, removes the config, the plugin and the agent's state files.
fn undo_cni(l: &Leftovers) -> Result<(Option<usize>, Vec<PathBuf>), String> {
    let pods = match &l.state_dir {
        Some(dir) => crate::agent::registry::load(dir).map(|eps| Some(eps.len())).map_err(|e| format!("reading the registry: {e}"))?,
        None => None,
    };
    let mut removed = Vec::new();
    let mark = flock_cni::removal::Removed {
        conflist: l.cni_conf.clone().unwrap_or_default(),
        binary: Some(l.cni_bin_dir.join("flock-cni")),
        agent_state_dir: l.state_dir.clone(),
    };
    if pods != Some(0) {
        if let Some(path) = &l.cni_conf {
            mark_conflist(path, &mark)?;
        }
        return Ok((pods, removed));
    }
    if let Some(path) = &l.cni_conf
        && is_flocks(path)
    {
        remove(path, &mut removed)?;
    }
    remove(&l.cni_bin_dir.join("flock-cni"), &mut removed)?;
    if let Ok(spooled) = flock_cni::protocol::read_spool(&l.spool_dir) {
        for (p, _) in spooled {
            remove(&p, &mut removed)?;
        }
    }
    remove_dir(&l.spool_dir, &mut removed);
    if let Some(dir) = &l.state_dir {
        for f in flock_cni::removal::AGENT_STATE_FILES {
            remove(&dir.join(f), &mut removed)?;
        }
        remove_dir(dir, &mut removed);
    }
    Ok((Some(0), removed))
}

/// Whether `path` is a conflist with a flock-cni plugin (flock wrote it).
fn is_flocks(path: &Path) -> bool {
    flock_cni::runtime::ConfList::load(path)
        .is_ok_and(|l| l.plugins.iter().any(|p| p.get("type").and_then(serde_json::Value::as_str) == Some("flock-cni")))
}

fn mark_conflist(path: &Path, mark: &flock_cni::removal::Removed) -> Result<(), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let Some(marked) = flock_cni::removal::mark(&text, mark) else {
        return Err(format!("{} has no flock-cni plugin to mark", path.display()));
    };
    let tmp = path.with_extension("tmp-flock");
    std::fs::write(&tmp, marked).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| format!("marking {}: {e}", path.display()))
}

fn remove(path: &Path, removed: &mut Vec<PathBuf>) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            removed.push(path.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

fn remove_dir(dir: &Path, removed: &mut Vec<PathBuf>) {
    if std::fs::remove_dir(dir).is_ok() {
        removed.push(dir.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RemovalOptions {
        RemovalOptions { namespace: "flock-system".into(), daemonset: "flock-agent".into(), cni_bin_dir: PathBuf::from("/opt/cni/bin") }
    }

    fn observed(ds: Seen, ds_known: bool, ns: Seen) -> Observed {
        Observed { daemonset: ds, daemonset_known: ds_known, namespace: ns, namespace_known: ns != Seen::Unknown }
    }

    fn removal(v: &Verdict) -> bool {
        matches!(v, Verdict::Removal(_))
    }

    #[test]
    fn removal_is_told_from_restart() {
        let o = opts();
        // A rolling update, a deleted pod, a drain: the DaemonSet stays.
        let rolling = observed(Seen::Present, true, Seen::Present);
        assert!(!removal(&decide(&rolling, Some(Seen::Present), None, &o)));
        assert!(!removal(&decide(&rolling, None, None, &o)));
        // helm uninstall / kubectl delete: the DaemonSet is deleted before its pods stop.
        let deleted = observed(Seen::Gone, true, Seen::Present);
        assert!(removal(&decide(&deleted, Some(Seen::Gone), None, &o)));
        // …and the RBAC with it: no last look, the watch saw it.
        assert!(removal(&decide(&deleted, None, None, &o)));
        assert!(removal(&decide(&observed(Seen::Deleting, true, Seen::Present), None, None, &o)));
        // The last look sees what the watch has not delivered yet.
        assert!(removal(&decide(&rolling, Some(Seen::Gone), None, &o)));
        assert!(removal(&decide(&rolling, Some(Seen::Deleting), None, &o)));
        // The namespace's deletion may stop pods before their DaemonSet goes.
        let ns = decide(&observed(Seen::Present, true, Seen::Deleting), Some(Seen::Present), None, &o);
        assert_eq!(ns, Verdict::Removal("namespace flock-system is being deleted".into()));
        // Deleted and made again: its next pod takes over.
        assert!(!removal(&decide(&deleted, Some(Seen::Present), None, &o)));
        // A DaemonSet never seen (a wrong name, no RBAC to watch it): never a removal.
        let never = observed(Seen::Gone, false, Seen::Present);
        assert!(!removal(&decide(&never, Some(Seen::Gone), None, &o)));
        assert!(!removal(&decide(&observed(Seen::Unknown, false, Seen::Unknown), None, None, &o)));
        // Nor a namespace listed away that was never seen.
        let ns_never = Observed { namespace: Seen::Gone, namespace_known: false, ..rolling };
        assert!(!removal(&decide(&ns_never, Some(Seen::Present), None, &o)));
        // The last look at the namespace sees its deletion before the watch does.
        assert!(removal(&decide(&rolling, Some(Seen::Present), Some(Seen::Gone), &o)));
        assert!(removal(&decide(&rolling, Some(Seen::Present), Some(Seen::Deleting), &o)));
        assert!(!removal(&decide(&rolling, Some(Seen::Present), Some(Seen::Present), &o)));
    }
}
