//! `flockctl conformance --kubeconfig FILE CASES...`: the case format on a real cluster,
//! whichever CNI it runs. The base cluster's namespaces and pods become real ones (agnhost
//! serving every port they declare), made once per run; each case's objects are carried over
//! (`flock::conformance::cluster`), every checked cell is probed from its source pod through
//! the API's exec (`agnhost connect`, as Kubernetes' own e2e probes), retried until it
//! matches or the settle time passes (a real cluster converges; the first match says how
//! long it took), and compared with the matrix. After each case the base is restored; at the
//! end, or on SIGINT/SIGTERM/SIGHUP, everything the run created is deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, AttachParams, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use flock::conformance::cluster::{Carried, FIELD_MANAGER, Live, Mapping, RUN_LABEL, Target};
use flock::conformance::{Case, Expect, Probe};
use flock::model::manifest::{Kind, Object};
use flock::model::{Family, ObjectRef, Protocol, Snapshot};
use flock::sim::runner::{CaseOutcome, Verdict};

/// How the run behaves on the cluster.
pub struct LiveOptions {
    pub image: String,
    pub prefix: String,
    pub parallel: usize,
    /// `agnhost connect --timeout`.
    pub connect_timeout: Duration,
    pub settle: Duration,
    pub ready_timeout: Duration,
    pub verbose: bool,
}

/// A probe's one cell: from a pod, to an address.
#[derive(Clone)]
struct Cell {
    from: String,
    to: String,
    pod: ObjectRef,
    container: String,
    dest: SocketAddr,
    protocol: Protocol,
    expected: bool,
    timeout: Duration,
}

pub struct Runner {
    client: kube::Client,
    base: Snapshot,
    mapping: Mapping,
    live: Live,
    opts: LiveOptions,
    /// The base's pods as created, by the case's key.
    base_pods: BTreeMap<ObjectRef, Carried>,
    /// The pods up now (case key → what was written, and the uid the case gave it).
    up: BTreeMap<ObjectRef, (Carried, String)>,
    cnp: ApiResource,
    /// Whether flock is the cluster's CNI (FlockNodes exist): then a wrong cell gets flock's
    /// explanation from the cluster's objects.
    flock: bool,
    /// Every step whose cells all matched: how many probe rounds that took (1: each cell
    /// matched at its first probe) and the seconds from the step's last write to its last
    /// cell matching.
    pub settled: Vec<(usize, f64)>,
}

/// A case's object the API server refuses as invalid: it never reaches the CNI, so the case
/// (written for what flock does with such an object) cannot run on a real cluster.
#[derive(Debug, thiserror::Error)]
#[error("the API server refuses {what}: {message}")]
struct Refused {
    what: String,
    message: String,
}

fn cnp_resource() -> ApiResource {
    let (group, version, kind, plural) = flock::conformance::cluster::CNP_RESOURCE;
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn protocol_arg(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "--protocol=tcp",
        Protocol::Udp => "--protocol=udp",
        Protocol::Sctp => "--protocol=sctp",
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

impl Runner {
    /// Finds what the cluster has (nodes, their pod CIDRs, SCTP, flock) and creates the base.
    pub async fn start(client: kube::Client, base: Snapshot, opts: LiveOptions, run: String) -> anyhow::Result<Self> {
        let nodes: Api<Node> = Api::all(client.clone());
        let listed = nodes.list(&ListParams::default()).await.context("listing the cluster's Nodes")?;
        let mut real: Vec<(String, Vec<String>)> = listed
            .items
            .iter()
            .filter(|n| !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
            .filter_map(|n| {
                let cidrs = n.spec.as_ref().and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
                n.metadata.name.clone().map(|name| (name, cidrs))
            })
            .collect();
        real.sort();
        let mut base_nodes: Vec<String> = base.nodes().map(|n| n.name.clone()).collect();
        base_nodes.sort();
        let names: BTreeSet<&String> = real.iter().map(|(n, _)| n).collect();
        let node_map: BTreeMap<String, String> = if base_nodes.iter().all(|n| names.contains(n)) {
            base_nodes.iter().map(|n| (n.clone(), n.clone())).collect()
        } else if real.len() >= base_nodes.len() {
            eprintln!(
                "the base's nodes are not the cluster's: placing {} on {}",
                base_nodes.join(", "),
                real.iter().take(base_nodes.len()).map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            );
            base_nodes.iter().cloned().zip(real.iter().map(|(n, _)| n.clone())).collect()
        } else {
            eprintln!(
                "warning: the cluster has {} schedulable nodes, the base {}: the scheduler places the pods; cases that depend on placement may differ",
                real.len(),
                base_nodes.len()
            );
            BTreeMap::new()
        };
        let mut live = Live::default();
        for (base_node, node) in &node_map {
            let cidrs = real.iter().find(|(n, _)| n == node).map(|(_, c)| c.clone()).unwrap_or_default();
            live.node_cidrs.insert(base_node.clone(), cidrs.iter().filter_map(|c| c.parse().ok()).collect());
        }
        let target =
            Target { prefix: opts.prefix.clone(), run, image: opts.image.clone(), sctp: false, nodes: node_map, families: Vec::new() };
        let mapping = Mapping::new(&base, target);
        let flock = {
            let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("flock.dev", "v1alpha1", "FlockNode"), "flocknodes");
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            api.list(&ListParams::default().limit(1)).await.map(|l| !l.items.is_empty()).unwrap_or(false)
        };
        let mut runner = Self {
            client,
            base,
            mapping,
            live,
            opts,
            base_pods: BTreeMap::new(),
            up: BTreeMap::new(),
            cnp: cnp_resource(),
            flock,
            settled: Vec::new(),
        };
        runner.remove_leftovers().await?;
        runner.create_base().await?;
        Ok(runner)
    }

    /// Namespaces and ClusterNetworkPolicies of the prefix that an earlier run left (killed
    /// before it could clean up): only those carrying the run label.
    async fn remove_leftovers(&self) -> anyhow::Result<()> {
        let lp = ListParams::default().labels(RUN_LABEL);
        let cnps: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.cnp);
        if let Ok(list) = cnps.list(&lp).await {
            for o in list.items.iter().filter_map(|o| o.metadata.name.clone()).filter(|n| n.starts_with(&self.opts.prefix)) {
                eprintln!("removing ClusterNetworkPolicy {o}, left by an earlier run");
                let _ = cnps.delete(&o, &DeleteParams::default()).await;
            }
        }
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let old: Vec<String> = nss
            .list(&lp)
            .await
            .context("listing namespaces")?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .filter(|n| n.starts_with(&self.opts.prefix))
            .collect();
        for n in &old {
            eprintln!("removing namespace {n}, left by an earlier run");
            let _ = nss.delete(n, &DeleteParams::default()).await;
        }
        self.wait_namespaces_gone(&old, Duration::from_secs(120)).await
    }

    async fn wait_namespaces_gone(&self, names: &[String], limit: Duration) -> anyhow::Result<()> {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let deadline = Instant::now() + limit;
        for n in names {
            while nss.get_opt(n).await.context("reading a namespace")?.is_some() {
                if Instant::now() > deadline {
                    bail!("namespace {n} is still there after {} s", limit.as_secs());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    async fn write(&self, c: &Carried) -> anyhow::Result<()> {
        let pp = apply_params();
        let patch = Patch::Apply(&c.object);
        let what = format!("{:?} {}{}", c.kind, c.namespace.as_ref().map(|n| format!("{n}/")).unwrap_or_default(), c.name);
        let r = match (c.kind, &c.namespace) {
            (Kind::Namespace, _) => Api::<Namespace>::all(self.client.clone()).patch(&c.name, &pp, &patch).await.map(drop),
            (Kind::Pod, Some(ns)) => Api::<Pod>::namespaced(self.client.clone(), ns).patch(&c.name, &pp, &patch).await.map(drop),
            (Kind::NetworkPolicy, Some(ns)) => {
                Api::<NetworkPolicy>::namespaced(self.client.clone(), ns).patch(&c.name, &pp, &patch).await.map(drop)
            }
            (Kind::ClusterNetworkPolicy, _) => {
                Api::<DynamicObject>::all_with(self.client.clone(), &self.cnp).patch(&c.name, &pp, &patch).await.map(drop)
            }
            _ => bail!("cannot write {what}"),
        };
        match r {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_invalid() => Err(Refused { what, message: s.message }.into()),
            Err(kube::Error::Api(s)) => bail!("writing {what}: {} ({} {})", s.message, s.code, s.reason),
            Err(e) => Err(anyhow::Error::new(e).context(format!("writing {what}"))),
        }
    }

    async fn delete(&self, kind: Kind, ns: Option<&str>, name: &str) -> anyhow::Result<()> {
        let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let r = match (kind, ns) {
            (Kind::Namespace, _) => Api::<Namespace>::all(self.client.clone()).delete(name, &dp).await.map(drop),
            (Kind::Pod, Some(ns)) => Api::<Pod>::namespaced(self.client.clone(), ns).delete(name, &dp).await.map(drop),
            (Kind::NetworkPolicy, Some(ns)) => Api::<NetworkPolicy>::namespaced(self.client.clone(), ns).delete(name, &dp).await.map(drop),
            (Kind::ClusterNetworkPolicy, _) => {
                Api::<DynamicObject>::all_with(self.client.clone(), &self.cnp).delete(name, &dp).await.map(drop)
            }
            _ => bail!("cannot delete {kind:?} {name}"),
        };
        ignore_gone(r).with_context(|| format!("deleting {kind:?} {name}"))
    }

    async fn delete_pod_and_wait(&mut self, key: &ObjectRef) -> anyhow::Result<()> {
        let real = self.mapping.pod(key);
        self.delete(Kind::Pod, Some(real.namespace()), &real.name).await?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), real.namespace());
        let deadline = Instant::now() + self.opts.ready_timeout;
        while api.get_opt(&real.name).await.with_context(|| format!("reading pod {real}"))?.is_some() {
            if Instant::now() > deadline {
                bail!("pod {real} is still there {} s after its deletion", self.opts.ready_timeout.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.up.remove(key);
        self.live.pods.remove(key);
        Ok(())
    }

    /// Waits until every pod of `keys` runs with all its containers ready, and records their
    /// addresses. A container that terminates names the pod.
    async fn wait_ready(&mut self, keys: &[ObjectRef]) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.opts.ready_timeout;
        for key in keys {
            let real = self.mapping.pod(key);
            let api: Api<Pod> = Api::namespaced(self.client.clone(), real.namespace());
            loop {
                let pod = api.get_opt(&real.name).await.with_context(|| format!("reading pod {real}"))?;
                let status = pod.as_ref().and_then(|p| p.status.clone()).unwrap_or_default();
                let statuses = status.container_statuses.clone().unwrap_or_default();
                let ready = status.phase.as_deref() == Some("Running") && !statuses.is_empty() && statuses.iter().all(|c| c.ready);
                let ips: Vec<IpAddr> = status.pod_ips.unwrap_or_default().iter().filter_map(|p| p.ip.parse().ok()).collect();
                if ready && !ips.is_empty() {
                    self.live.pods.insert(key.clone(), ips);
                    break;
                }
                if let Some(c) = statuses.iter().find(|c| c.restart_count > 2) {
                    bail!("pod {real}: container {} keeps restarting", c.name);
                }
                if Instant::now() > deadline {
                    bail!("pod {real} is not ready after {} s (phase {:?})", self.opts.ready_timeout.as_secs(), status.phase);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        Ok(())
    }

    /// Whether the nodes have SCTP: a pod whose only server is agnhost porter on SCTP runs
    /// where they do, and fails where socket(…, IPPROTO_SCTP) does not exist.
    async fn detect_sctp(&self, ns: &str) -> anyhow::Result<bool> {
        let node = self.mapping.target.nodes.values().next();
        let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sctp-check", "namespace": ns, "labels": {RUN_LABEL: self.mapping.target.run}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
                "containers": [{"name": "porter", "image": self.opts.image, "imagePullPolicy": "IfNotPresent", "command": ["/agnhost", "porter"],
                    "env": [{"name": "SERVE_SCTP_PORT_9", "value": "foo"}], "ports": [{"containerPort": 9, "protocol": "SCTP"}]}]}});
        if let Some(n) = node {
            pod["spec"]["nodeName"] = Value::String(n.clone());
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        api.patch("sctp-check", &apply_params(), &Patch::Apply(&pod)).await.context("creating the SCTP check pod")?;
        let deadline = Instant::now() + self.opts.ready_timeout;
        let mut running_since: Option<Instant> = None;
        let has = loop {
            let p = api.get("sctp-check").await.context("reading the SCTP check pod")?;
            match p.status.and_then(|s| s.phase).as_deref() {
                Some("Failed") | Some("Succeeded") => break false,
                Some("Running") => {
                    let since = *running_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(3) {
                        break true;
                    }
                }
                _ => {}
            }
            if Instant::now() > deadline {
                eprintln!(
                    "warning: the SCTP check pod did not start in {} s: taking the nodes to lack SCTP",
                    self.opts.ready_timeout.as_secs()
                );
                break false;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        let _ = api.delete("sctp-check", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await;
        Ok(has)
    }

    /// Writes the base's namespaces as they are in the base (a case's label changes undone).
    async fn write_base_namespaces(&self) -> anyhow::Result<Vec<Carried>> {
        let namespaces: Vec<Carried> = self
            .base
            .namespaces()
            .map(|n| {
                self.mapping.namespace_object(
                    &n.name,
                    (&n.labels).into_iter().map(|(k, v)| (k.to_string(), v.to_string())),
                    Default::default(),
                )
            })
            .collect();
        for n in &namespaces {
            self.write(n).await?;
        }
        Ok(namespaces)
    }

    async fn create_base(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let namespaces = self.write_base_namespaces().await?;
        let first = namespaces.first().map(|n| n.name.clone()).context("the base cluster has no namespace")?;
        self.mapping.target.sctp = self.detect_sctp(&first).await?;
        let pods: Vec<_> = self.base.pods().cloned().collect();
        let mut keys = Vec::new();
        for p in &pods {
            let c = self.mapping.pod_object(p).map_err(anyhow::Error::msg)?;
            self.write(&c).await?;
            self.base_pods.insert(p.key(), c.clone());
            self.up.insert(p.key(), (c, p.uid.clone()));
            keys.push(p.key());
        }
        self.wait_ready(&keys).await?;
        let mut families: Vec<Family> = Vec::new();
        for ip in keys.first().and_then(|k| self.live.pods.get(k)).into_iter().flatten() {
            if !families.contains(&Family::of(*ip)) {
                families.push(Family::of(*ip));
            }
        }
        self.mapping.target.families = families.clone();
        eprintln!(
            "created the base cluster on the cluster ({} namespaces, {} pods, {}; SCTP {}; flock {}) in {:.1}s",
            namespaces.len(),
            keys.len(),
            families.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("+"),
            if self.mapping.target.sctp { "available" } else { "not available on the nodes" },
            if self.flock { "is the CNI" } else { "is not the CNI" },
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Runs one case and restores the base.
    pub async fn run_case(&mut self, case: &Case) -> CaseOutcome {
        let mut out = CaseOutcome::new();
        if let Some(why) = self.mapping.skip_reason(&self.base, case) {
            out.verdict = Verdict::Skip;
            out.skip_reasons.push(why);
            return out;
        }
        let mut refused = None;
        for (i, step) in case.steps.iter().enumerate() {
            if !step.wait().is_zero() {
                tokio::time::sleep(step.wait()).await;
            }
            let started = Instant::now();
            if let Err(e) = self.step(i, step, case, &mut out).await {
                match e.downcast_ref::<Refused>() {
                    Some(r) => refused = Some(format!("step {}: {r}", i + 1)),
                    None => out.errors.push(format!("step {}: {e:#}", i + 1)),
                }
                break;
            }
            out.step_times.push(started.elapsed());
        }
        if let Err(e) = self.restore().await {
            out.errors.push(format!("restoring the base cluster: {e:#}"));
        }
        out.verdict = if !out.mismatches.is_empty() || !out.errors.is_empty() {
            Verdict::Fail
        } else if let Some(why) = refused {
            out.skip_reasons = vec![why];
            Verdict::Skip
        } else if out.probes_run == 0 && out.probes_skipped > 0 {
            Verdict::Skip
        } else {
            Verdict::Pass
        };
        out
    }

    async fn step(&mut self, i: usize, step: &flock::conformance::Step, case: &Case, out: &mut CaseOutcome) -> anyhow::Result<()> {
        // Namespaces, then pods (a policy may name their addresses), then policies.
        let mut policies = Vec::new();
        for raw in step.raw_apply() {
            match self.mapping.carry(raw, &self.live).map_err(anyhow::Error::msg)? {
                Some(c) if c.kind == Kind::Namespace => self.write(&c).await?,
                Some(c) => policies.push(c),
                None => {}
            }
        }
        let mut new = Vec::new();
        for o in &step.apply {
            let Object::Pod(p) = o else { continue };
            let c = self.mapping.pod_object(p).map_err(anyhow::Error::msg)?;
            let replace = self
                .up
                .get(&p.key())
                .is_some_and(|(old, uid)| old.object["spec"] != c.object["spec"] || (!p.uid.is_empty() && *uid != p.uid));
            if replace {
                self.delete_pod_and_wait(&p.key()).await?;
            }
            self.write(&c).await?;
            self.up.insert(p.key(), (c, p.uid.clone()));
            self.mapping.learn(p);
            new.push(p.key());
        }
        self.wait_ready(&new).await?;
        for c in &policies {
            self.write(c).await?;
        }
        for d in step.deletions() {
            let (kind, ns, name) = self.mapping.deletion(d);
            if kind == Kind::Pod {
                self.delete_pod_and_wait(&d.key).await?;
            } else {
                self.delete(kind, ns.as_deref(), &name).await?;
                if kind == Kind::Namespace {
                    let gone: Vec<ObjectRef> = self.up.keys().filter(|k| k.namespace() == d.key.name).cloned().collect();
                    for k in gone {
                        self.up.remove(&k);
                        self.live.pods.remove(&k);
                    }
                }
            }
        }
        let written = Instant::now();
        let mut last_match = Duration::ZERO;
        let mut rounds = 0;
        let mut all_matched = true;
        for probe in &step.probes {
            if probe.protocol == Protocol::Sctp && !self.mapping.target.sctp {
                out.probes_skipped += 1;
                let why = "SCTP not available on the cluster's nodes".to_string();
                if !out.skip_reasons.contains(&why) {
                    out.skip_reasons.push(why);
                }
                continue;
            }
            let cells = self.cells(probe)?;
            let (observed, errors, matched) = self.probe(&cells, written).await;
            out.probes_run += 1;
            out.errors.extend(errors.into_iter().map(|e| format!("step {}: {}: {e}", i + 1, probe.label())));
            match matched {
                Some((r, t)) => {
                    rounds = rounds.max(r);
                    last_match = last_match.max(t);
                }
                None => all_matched = false,
            }
            let mismatches = flock::conformance::compare_cells(i, probe, &observed);
            if !mismatches.is_empty() && self.flock {
                self.explain(i, probe, &mismatches, out).await;
            }
            out.mismatches.extend(mismatches);
        }
        if all_matched && rounds > 0 {
            self.settled.push((rounds, last_match.as_secs_f64()));
            if self.opts.verbose {
                eprintln!(
                    "  {} step {}: every cell as expected {:.2}s after the step's writes ({rounds} probe round{})",
                    case.dir_name,
                    i + 1,
                    last_match.as_secs_f64(),
                    if rounds == 1 { "" } else { "s" }
                );
            }
        }
        Ok(())
    }

    /// The checked cells of a probe, with the cluster's addresses.
    fn cells(&self, probe: &Probe) -> anyhow::Result<Vec<Cell>> {
        let family = self.mapping.probe_family(probe).context("the cluster lacks the probe's family")?;
        let mut cells = Vec::new();
        for from in &probe.order {
            for to in &probe.order {
                let expected = probe.expect(from, to);
                if from == to || expected == Expect::Unchecked {
                    continue;
                }
                let (Some(f), Some(t)) = (ObjectRef::parse(from), ObjectRef::parse(to)) else { bail!("{from} -> {to}: not pods") };
                let (Some((src, _)), Some(ips)) = (self.up.get(&f), self.live.pods.get(&t)) else {
                    bail!("{from} -> {to}: {} is not up", if self.up.contains_key(&f) { to } else { from })
                };
                let ip =
                    ips.iter().find(|ip| Family::of(**ip) == family).with_context(|| format!("{to} has no {} address", family.as_str()))?;
                let container = Mapping::client_container(&src.object).context("a pod without containers")?.to_string();
                cells.push(Cell {
                    from: from.clone(),
                    to: to.clone(),
                    pod: self.mapping.pod(&f),
                    container,
                    dest: SocketAddr::new(*ip, probe.port),
                    protocol: probe.protocol,
                    expected: expected == Expect::Connect,
                    timeout: self.opts.connect_timeout,
                });
            }
        }
        Ok(cells)
    }

    /// Probes every cell, again each one that differs from its expectation until it
    /// matches or the settle time passes. Returns what each cell saw last, the cells that
    /// could not be probed, and the rounds it took and when the last cell matched (`None`:
    /// not all did).
    async fn probe(&self, cells: &[Cell], written: Instant) -> (BTreeMap<(String, String), bool>, Vec<String>, Option<(usize, Duration)>) {
        let mut observed = BTreeMap::new();
        let mut errors = BTreeMap::new();
        let mut pending: Vec<Cell> = cells.to_vec();
        let mut matched_at = Duration::ZERO;
        let deadline = written + self.opts.settle;
        let mut rounds = 0;
        loop {
            rounds += 1;
            let sem = Arc::new(tokio::sync::Semaphore::new(self.opts.parallel.max(1)));
            let mut set = tokio::task::JoinSet::new();
            for c in pending.drain(..) {
                let client = self.client.clone();
                let sem = sem.clone();
                set.spawn(async move {
                    let _permit = sem.acquire_owned().await;
                    let r = connect(&client, &c).await;
                    (c, r)
                });
            }
            let mut again = Vec::new();
            while let Some(joined) = set.join_next().await {
                let Ok((c, r)) = joined else { continue };
                let key = (c.from.clone(), c.to.clone());
                match r {
                    Ok(connected) => {
                        errors.remove(&key);
                        observed.insert(key, connected);
                        if connected == c.expected {
                            matched_at = matched_at.max(written.elapsed());
                        } else {
                            again.push(c);
                        }
                    }
                    Err(e) => {
                        errors.insert(key, format!("{} -> {}: {e}", c.from, c.to));
                        again.push(c);
                    }
                }
            }
            if again.is_empty() {
                return (observed, Vec::new(), Some((rounds, matched_at)));
            }
            if Instant::now() >= deadline {
                return (observed, errors.into_values().collect(), None);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            pending = again;
        }
    }

    /// flock's explanation of the wrong cells (at most five), from the cluster's objects.
    async fn explain(&self, step: usize, probe: &Probe, mismatches: &[flock::conformance::Mismatch], out: &mut CaseOutcome) {
        let Some(family) = self.mapping.probe_family(probe) else { return };
        let snapshot = match flock::source::kube::list_cluster(&self.client).await {
            Ok(l) => l.snapshot,
            Err(e) => {
                out.errors.push(format!("step {}: explaining: reading the cluster: {e}", step + 1));
                return;
            }
        };
        for m in mismatches.iter().take(5) {
            let (Some(f), Some(t)) = (ObjectRef::parse(m.from()), ObjectRef::parse(m.to())) else { continue };
            let why = flock::conformance::cluster::explain_cell(
                &snapshot,
                &self.mapping.pod(&f),
                &self.mapping.pod(&t),
                probe.protocol,
                probe.port,
                family,
            );
            out.errors.push(format!("step {} {} {} -> {}: {why}", step + 1, probe.label(), m.from(), m.to()));
        }
    }

    /// Back to the base: the case's policies, namespaces and pods go, the base's come back
    /// as they were.
    async fn restore(&mut self) -> anyhow::Result<()> {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.mapping.target.run));
        let nps: Api<NetworkPolicy> = Api::all(self.client.clone());
        for p in nps.list(&lp).await.context("listing the run's NetworkPolicies")?.items {
            if let (Some(ns), Some(name)) = (p.metadata.namespace, p.metadata.name) {
                self.delete(Kind::NetworkPolicy, Some(&ns), &name).await?;
            }
        }
        let cnps: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.cnp);
        if let Ok(list) = cnps.list(&lp).await {
            for name in list.items.into_iter().filter_map(|o| o.metadata.name) {
                self.delete(Kind::ClusterNetworkPolicy, None, &name).await?;
            }
        }
        let base_ns: BTreeSet<String> = self.base.namespaces().map(|n| self.mapping.namespace(&n.name)).collect();
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let mut gone = Vec::new();
        for n in nss.list(&lp).await.context("listing the run's namespaces")?.items.into_iter().filter_map(|n| n.metadata.name) {
            if !base_ns.contains(&n) {
                self.delete(Kind::Namespace, None, &n).await?;
                gone.push(n);
            }
        }
        self.write_base_namespaces().await?;
        let extra: Vec<ObjectRef> = self.up.keys().filter(|k| !self.base_pods.contains_key(*k)).cloned().collect();
        for k in extra {
            if base_ns.contains(&self.mapping.namespace(k.namespace())) {
                self.delete_pod_and_wait(&k).await?;
            } else {
                self.up.remove(&k);
                self.live.pods.remove(&k);
            }
        }
        let mut back = Vec::new();
        for (key, c) in self.base_pods.clone() {
            let same = self.up.get(&key).is_some_and(|(now, _)| now.object == c.object);
            if same {
                continue;
            }
            let spec_same = self.up.get(&key).is_some_and(|(now, _)| now.object["spec"] == c.object["spec"]);
            if !spec_same && self.up.contains_key(&key) {
                self.delete_pod_and_wait(&key).await?;
            }
            self.write(&c).await?;
            let uid = self.base.pod_by_name(&key).map(|p| p.uid.clone()).unwrap_or_default();
            self.up.insert(key.clone(), (c, uid));
            back.push(key);
        }
        self.wait_ready(&back).await?;
        self.wait_namespaces_gone(&gone, self.opts.ready_timeout).await?;
        self.mapping.reset(&self.base);
        Ok(())
    }

    /// Deletes everything the run created (its namespaces take their pods and policies).
    pub async fn teardown(&self) -> anyhow::Result<()> {
        teardown_run(&self.client, &self.mapping.target.run).await
    }
}

/// Deletes everything run `run` created, found by its label, and waits (up to two minutes)
/// for its namespaces to go.
pub async fn teardown_run(client: &kube::Client, run: &str) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let cnps: Api<DynamicObject> = Api::all_with(client.clone(), &cnp_resource());
    if let Ok(list) = cnps.list(&lp).await {
        for name in list.items.into_iter().filter_map(|o| o.metadata.name) {
            ignore_gone(cnps.delete(&name, &dp).await.map(drop)).with_context(|| format!("deleting ClusterNetworkPolicy {name}"))?;
        }
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> =
        nss.list(&lp).await.context("listing the run's namespaces")?.items.into_iter().filter_map(|n| n.metadata.name).collect();
    for n in &names {
        ignore_gone(nss.delete(n, &dp).await.map(drop)).with_context(|| format!("deleting namespace {n}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for n in &names {
        while nss.get_opt(n).await.context("reading a namespace")?.is_some() {
            if Instant::now() > deadline {
                bail!("namespace {n} is still there two minutes after its deletion");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

fn ignore_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        r => r,
    }
}

/// One `agnhost connect` in the source pod: `Ok(true)` when it connected (exit 0),
/// `Ok(false)` when it did not (a non-zero exit: TIMEOUT, REFUSED, …), `Err` when the probe
/// itself could not run.
async fn connect(client: &kube::Client, c: &Cell) -> anyhow::Result<bool> {
    let api: Api<Pod> = Api::namespaced(client.clone(), c.pod.namespace());
    let cmd = vec![
        "/agnhost".to_string(),
        "connect".into(),
        c.dest.to_string(),
        format!("--timeout={}ms", c.timeout.as_millis().max(1)),
        protocol_arg(c.protocol).into(),
    ];
    let ap = AttachParams::default().container(c.container.clone()).stdin(false).stdout(true).stderr(true);
    let run = async {
        let mut attached = api.exec(&c.pod.name, cmd, &ap).await.with_context(|| format!("exec in {}", c.pod))?;
        // Both streams at once: a full one would stall the other (their buffers are small).
        let (out, err) = (attached.stdout(), attached.stderr());
        let (_, stderr) = tokio::join!(drain(out), drain(err));
        let stderr = String::from_utf8_lossy(&stderr).to_string();
        let status = match attached.take_status() {
            Some(s) => s.await,
            None => None,
        };
        let _ = attached.join().await;
        let status = status.context("the exec ended without a status")?;
        match (status.status.as_deref(), status.reason.as_deref()) {
            (Some("Success"), _) => Ok(true),
            (_, Some("NonZeroExitCode")) => Ok(false),
            _ => bail!("exec failed: {} {}", status.message.unwrap_or_default(), stderr.trim()),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), run).await.context("the exec did not end in 20 s")?
}

/// Reads a stream of an exec to its end (at most 64 KiB kept).
async fn drain(r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(r) = r {
        let _ = r.take(64 * 1024).read_to_end(&mut buf).await;
    }
    buf
}

/// The run's id: unique enough between runs on one cluster.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}-{}", nanos & 0xff_ffff_ffff, std::process::id())
}
