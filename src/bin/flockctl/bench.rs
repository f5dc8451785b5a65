//! `flockctl bench`: the pipeline's cost on a synthetic cluster ([`flock::synth`]), as JSON on
//! stdout.
//!
//! For the node with `--pods-per-node` local pods: translate, render and text times (median,
//! min and max of `--runs` runs), the ruleset's size, what doubling every peer does to it, the
//! snapshot's memory, and what FlockNode's status costs (the run policies, the ruleset's hash). As root, also the nft side in throwaway network namespaces
//! (`flkt-*`, removed on exit): a first full apply, a full resync of an existing table and a
//! one-pod change through the [`Applier`], each next to a raw `nft -f` of the same rendered
//! text in a fresh namespace, measured in the same loop.
//!
//! With `--dataplane`, the data path instead (`crate::dataplane`): new connections per second
//! through a node with flock's ruleset, next to conntrack alone. With `--conntrack-entries N`,
//! a revocation sweep over N connections (`crate::sweep`).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

use flock::apply::kernel::NftCli;
use flock::apply::{Applier, Backend, Drift, Outcome, transaction};
use flock::model::{ObjectRef, Pod, Snapshot};
use flock::render::{self, Ruleset};
use flock::synth::{self, Cluster, Params};
use flock::translate::{self, Options};
use flock_cni::testing::NetnsGuard;

use crate::twins::median;

#[derive(Args)]
pub struct BenchArgs {
    /// Pods in the cluster (besides a few system pods).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// NetworkPolicies in the cluster.
    #[arg(long, default_value_t = 1_000)]
    policies: usize,
    /// ClusterNetworkPolicies of the Admin tier.
    #[arg(long, default_value_t = 0)]
    admin_policies: usize,
    /// ClusterNetworkPolicies of the Baseline tier.
    #[arg(long, default_value_t = 0)]
    baseline_policies: usize,
    /// Application namespaces [default: policies / 10].
    #[arg(long)]
    namespaces: Option<usize>,
    /// Pods per node; the benchmarked node has this many.
    #[arg(long, default_value_t = 110)]
    pods_per_node: usize,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timed runs of each measurement (median, min and max are reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Skip the nft measurements (otherwise run as root, in throwaway network namespaces).
    #[arg(long)]
    no_apply: bool,
    /// Measure the data path instead of the pipeline: new TCP connections/s through a node
    /// with flock's ruleset and with conntrack alone (root; throwaway network namespaces).
    /// Its synthetic scenario is the cluster of the options above (--pods, --policies, …).
    #[arg(long)]
    dataplane: bool,
    #[command(flatten)]
    dataplane_args: crate::dataplane::DataplaneArgs,
    /// Measure a revocation sweep instead (root; a throwaway network namespace): list this
    /// many conntrack entries of node-0's pods, judge each against node-0's policy, mark the
    /// denied ones.
    #[arg(long, value_name = "N")]
    conntrack_entries: Option<usize>,
    /// Measure `flockctl whatif` instead: an Admin ClusterNetworkPolicy denying one
    /// application namespace's egress to every pod, every pod pair judged on every declared
    /// port.
    #[arg(long)]
    whatif: bool,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let mut params = Params::new(args.pods, args.policies);
    params.namespaces = args.namespaces.unwrap_or(params.namespaces);
    params.pods_per_node = args.pods_per_node;
    params.seed = args.seed;
    params.admin_policies = args.admin_policies;
    params.baseline_policies = args.baseline_policies;
    if let Some(n) = args.conntrack_entries {
        let out = crate::sweep::run(&params, n, args.runs).context("revocation-sweep benchmark")?;
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.whatif {
        let out = whatif(&params, args.runs).context("whatif benchmark")?;
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.dataplane {
        let out = crate::dataplane::run(&params, &args.dataplane_args).context("data-path benchmark")?;
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }

    let rss_before = rss_bytes();
    let started = Instant::now();
    let cluster = synth::generate(&params);
    let generate = started.elapsed();
    let snapshot_bytes = rss_bytes().zip(rss_before).map(|(after, before)| after.saturating_sub(before));

    let s = &cluster.snapshot;
    let endpoints = s.derived_endpoints(&cluster.node);
    let options = Options::default();
    let (mut t_translate, mut t_render, mut t_text, mut t_total) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..args.runs {
        let t0 = Instant::now();
        let np = translate::translate(s, &endpoints, &options);
        let t1 = Instant::now();
        let rs = render::render(&np);
        let t2 = Instant::now();
        let text = rs.to_text();
        let t3 = Instant::now();
        t_translate.push(t1 - t0);
        t_render.push(t2 - t1);
        t_text.push(t3 - t2);
        t_total.push(t3 - t0);
        last = Some((np, rs, text));
    }
    let Some((np, rs, text)) = last else { bail!("no run") };
    let st = rs.stats();
    let local = endpoints.len().max(1);

    let mut out = json!({
        "params": {
            "pods": params.pods,
            "policies": params.policies,
            "admin_policies": params.admin_policies,
            "baseline_policies": params.baseline_policies,
            "namespaces": params.namespaces,
            "pods_per_node": params.pods_per_node,
            "seed": params.seed,
            "runs": args.runs,
        },
        "cluster": {
            "pods": s.pod_count(),
            "policies": s.policy_count(),
            "cluster_policies": s.cluster_policies().count(),
            "namespaces": s.namespaces().count(),
            "nodes": cluster.nodes,
            "family": if cluster.ipv6 { "ipv6" } else { "ipv4" },
            "generate_ms": ms(generate),
        },
        "snapshot_memory": {
            "rss_growth_bytes": snapshot_bytes,
            "bytes_per_pod": snapshot_bytes.map(|b| b / s.pod_count().max(1)),
            "note": "resident-set growth while generating the snapshot (pods, policies, namespaces, nodes), per pod",
        },
        "node": {
            "name": cluster.node,
            "local_pods": endpoints.len(),
            "policy_problems": np.problems.len(),
        },
        "translate_ms": stats(&t_translate),
        "render_ms": stats(&t_render),
        "text_ms": stats(&t_text),
        "translate_render_text_ms": stats(&t_total),
        "ruleset": {
            "chains": st.chains,
            "rules": st.rules,
            "sets": st.sets,
            "elements": st.elements,
            "text_bytes": text.len(),
            "rules_per_pod": st.rules as f64 / local as f64,
            "elements_per_pod": st.elements as f64 / local as f64,
            "largest_sets": largest_sets(&rs, 5),
        },
        "peer_doubling": peer_doubling(&cluster, &endpoints, &options, &rs),
        "one_pod_change": one_pod_change(&cluster, &rs, args.runs).context("one-pod change")?,
        "node_status": node_status(&cluster, &rs, args.runs).context("node status")?,
    });
    out["apply"] = if args.no_apply {
        json!({"skipped": "--no-apply"})
    } else if !nix::unistd::geteuid().is_root() {
        json!({"skipped": "not root"})
    } else {
        apply_bench(&cluster, &rs, &text, args.runs).context("nft measurements")?
    };
    print_json(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `whatif` on the synthetic cluster with an Admin ClusterNetworkPolicy denying the egress of
/// its first application pod's namespace to every pod.
fn whatif(params: &Params, runs: usize) -> anyhow::Result<Value> {
    use flock::explain::whatif::Scope;
    let cluster = synth::generate(params);
    let before = &cluster.snapshot;
    let Some(ns) = before.pods().map(|p| p.namespace.clone()).find(|ns| ns != "kube-system") else { bail!("no application pod") };
    let text = format!(
        "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {{name: whatif-deny}}\n\
         spec: {{tier: Admin, priority: 1, subject: {{namespaces: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}},\n\
         egress: [{{name: no-pods, action: Deny, to: [{{namespaces: {{}}}}]}}]}}\n"
    );
    let change = flock::model::manifest::parse_str(std::path::Path::new("whatif-deny.yaml"), &text)?;
    let mut after = before.clone();
    flock::model::manifest::apply_change(&mut after, &change.objects, &[]);
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let w = flock::explain::whatif::whatif(before, &after, &Options::default(), &Scope::default(), 1000);
        times.push(t.elapsed());
        last = Some(w);
    }
    let Some(w) = last else { bail!("no run") };
    Ok(json!({
        "params": {"pods": params.pods, "policies": params.policies, "admin_policies": params.admin_policies,
                   "baseline_policies": params.baseline_policies, "namespaces": params.namespaces, "seed": params.seed, "runs": runs},
        "change": format!("Admin ClusterNetworkPolicy whatif-deny: {ns}'s pods may reach no pod"),
        "pods": w.pods,
        "classes": w.classes,
        "flows_explained": w.evaluated,
        "flows_changed": w.total,
        "whatif_ms": stats(&times),
    }))
}

fn print_json(out: &Value) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, out).context("writing to stdout")?;
    writeln!(stdout).context("writing to stdout")
}

/// Rules must not grow with the number of peer addresses: every pod of the other nodes gets
/// a copy (same labels and namespace, a new address on a new node), which doubles the peers
/// of every selector, and the node is rendered again.
fn peer_doubling(cluster: &Cluster, endpoints: &[flock::model::LocalEndpoint], options: &Options, before: &Ruleset) -> Value {
    let mut s = cluster.snapshot.clone();
    let remote: Vec<Pod> = s.pods().filter(|p| p.node.as_deref() != Some(cluster.node.as_str())).cloned().collect();
    for (n, pod) in remote.iter().enumerate() {
        match cluster.copy_pod(pod, n) {
            Some(copy) => s.upsert_pod(copy),
            None => return json!({"skipped": "no address left for the copies in 198.18.0.0/15"}),
        }
    }
    let after = render::render(&translate::translate(&s, endpoints, options)).stats();
    let b = before.stats();
    json!({
        "pods": s.pod_count(),
        "rules_before": b.rules,
        "rules_after": after.rules,
        "elements_before": b.elements,
        "elements_after": after.elements,
        "rules_unchanged": b.rules == after.rules,
    })
}

/// The nft side: per run, a raw `nft -f` of the rendered text into a fresh namespace, a first
/// full apply into another fresh one, a full resync there, and a one-pod change there.
fn apply_bench(cluster: &Cluster, rs: &Ruleset, text: &str, runs: usize) -> anyhow::Result<Value> {
    let (mut raw, mut full, mut resync, mut change, mut change_pipeline) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut noop, mut noop_read) = (Vec::new(), Vec::new());
    let (mut raw_transaction, mut canonical, mut list, mut read_state) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let first_transaction = transaction(rs, &BTreeSet::new(), text);
    let mut one_pod = OnePodChange::new(cluster, rs)?;
    for _ in 0..runs {
        for (script, times) in [(text, &mut raw), (first_transaction.as_str(), &mut raw_transaction)] {
            let ns = NetnsGuard::new("bench-raw");
            let mut nft = NftCli::new(ns.netns());
            let t = Instant::now();
            nft.run(script).context("raw nft -f")?;
            times.push(t.elapsed());
        }
        // The canonical form of the render: what a restarted agent compares with the kernel's
        // text listing to adopt its table (once per start; not part of an apply).
        let t = Instant::now();
        flock::nft::canonical(text).context("canonical form of the render")?;
        canonical.push(t.elapsed());

        let ns = NetnsGuard::new("bench-apply");
        // As in the agent, the drift baseline is read beside the applier, not as part of a
        // transaction: it is measured on its own below (read_state).
        let mut applier = Applier::new(NftCli::new(ns.netns())).defer_baseline();
        let t = Instant::now();
        applier.apply(rs).context("full apply")?;
        full.push(t.elapsed());

        // A full resync starts by listing the table's objects.
        let t = Instant::now();
        applier.backend_mut().list_objects().context("listing the table's objects")?;
        list.push(t.elapsed());

        // What a drift check reads (and the baseline after a transaction): the table over
        // netlink, every element but the timed sets'.
        let t = Instant::now();
        applier.backend_mut().read_state().context("reading the table as typed objects")?;
        read_state.push(t.elapsed());

        applier.invalidate();
        let t = Instant::now();
        applier.apply(rs).context("full resync")?;
        resync.push(t.elapsed());

        // A periodic resync when nothing changed, as the agent does it: the table read back
        // equals the baseline read after the last transaction, and the render equals what
        // was applied, so no transaction is sent.
        applier.record_baseline().context("reading the drift baseline")?;
        let t = Instant::now();
        let drift = applier.check_drift().context("drift check")?;
        let outcome = applier.apply(rs).context("no-op resync")?;
        noop.push(t.elapsed());
        if drift != Drift::InSync || outcome != Outcome::Unchanged {
            bail!("a resync with nothing changed found {drift:?} and did {outcome:?}");
        }
        // The same after another commit moved the ruleset's generation (as each answer the
        // DNS proxy learns from does): the table is read and compared.
        // (A transaction that changes nothing is not committed: this one adds and deletes a
        // table of the bench's namespace.)
        applier
            .backend_mut()
            .run("add table inet flkt-generation\ndelete table inet flkt-generation\n")
            .context("a commit that leaves table inet flock as it is")?;
        let t = Instant::now();
        let drift = applier.check_drift().context("drift check")?;
        let outcome = applier.apply(rs).context("no-op resync")?;
        noop_read.push(t.elapsed());
        if drift != Drift::InSync || outcome != Outcome::Unchanged {
            bail!("a resync with nothing changed but the generation found {drift:?} and did {outcome:?}");
        }

        // The pod appears, then disappears again: two changes from what is applied.
        for _ in 0..2 {
            let t = Instant::now();
            let changed = one_pod.toggle();
            change_pipeline.push(t.elapsed());
            let t = Instant::now();
            applier.apply(&changed).context("one-pod change")?;
            change.push(t.elapsed());
        }
    }
    let median = |v: &[Duration]| median(v).as_secs_f64();
    Ok(json!({
        "raw_nft_f_ms": stats(&raw),
        "full_apply_ms": stats(&full),
        "full_resync_ms": stats(&resync),
        "noop_resync_ms": stats(&noop),
        "noop_resync_read_ms": stats(&noop_read),
        "noop_resync_note": "a periodic resync with nothing changed: the ruleset's generation equals the one read with the drift baseline (after the last transaction, off the sync path), the render compared with the last applied one; no transaction. noop_resync_read_ms: the same after a commit moved the generation (each DNS answer learned from does): the table read back over netlink (no timed set's elements) and compared with the baseline",
        "one_pod_change": {
            "what": one_pod.what,
            "translate_render_ms": stats(&change_pipeline),
            "apply_ms": stats(&change),
        },
        "applier_parts": {
            "note": "pieces of an apply measured alone: nft -f of the whole first transaction (declarations and the table), the canonical form of the render (compared with the kernel's text listing when a restarted agent adopts its table), one listing of the table's objects (nft -j -t), and what a drift check reads: the table over netlink, every element but the timed sets'",
            "transaction_bytes": first_transaction.len(),
            "text_bytes": text.len(),
            "nft_f_transaction_ms": stats(&raw_transaction),
            "canonical_ms": stats(&canonical),
            "list_objects_ms": stats(&list),
            "read_state_ms": stats(&read_state),
        },
        "full_apply_vs_raw": median(&full) / median(&raw),
        "full_resync_vs_raw": median(&resync) / median(&raw),
        "one_pod_change_vs_raw": median(&change) / median(&raw),
    }))
}

/// A pod that appears and disappears: a new pod like a peer pod of one of the node's sets, so the
/// node's ruleset changes by one element each time. Translated and rendered as the agent does
/// it: incrementally ([`translate::Incremental`], [`render::RenderCache`]).
struct OnePodChange {
    snapshot: Snapshot,
    endpoints: Vec<flock::model::LocalEndpoint>,
    pod: Pod,
    present: bool,
    what: String,
    translation: translate::Incremental,
    cache: render::RenderCache,
}

impl OnePodChange {
    fn new(cluster: &Cluster, rs: &Ruleset) -> anyhow::Result<Self> {
        let s = &cluster.snapshot;
        // Elements of peer sets and peer-address maps name their pod (`namespace/name`): copy
        // the first one's.
        let peer = rs
            .objects
            .iter()
            .filter_map(|o| match o {
                render::Object::Set(set) if set.name.starts_with("peers-") || set.name.contains("-peer-addrs-") => set.elements.first(),
                _ => None,
            })
            .find_map(|e| e.comment.split_once('/').and_then(|(ns, name)| s.pod_by_name(&ObjectRef::new(ns, name))));
        let Some(peer) = peer else { bail!("the node's ruleset has no pod peer set") };
        let pod = cluster.new_pod_like(peer);
        let what = format!(
            "pod {}/{} appears and disappears (like peer {}/{}, on {} in its pod CIDR)",
            pod.namespace,
            pod.name,
            peer.namespace,
            peer.name,
            pod.node.as_deref().unwrap_or("?")
        );
        let endpoints = s.derived_endpoints(&cluster.node);
        let translation = translate::Incremental::new(s, &endpoints, &Options::default());
        let mut cache = render::RenderCache::new(render::RenderOptions::default());
        cache.render(translation.policy(), translation.changed());
        Ok(Self { snapshot: s.clone(), endpoints, pod, present: false, what, translation, cache })
    }

    /// Adds or removes the pod; translates and renders what changed.
    fn toggle(&mut self) -> Ruleset {
        let change = translate::Change::pod_before(&self.snapshot, &self.pod.uid);
        if self.present {
            self.snapshot.remove_pod(&self.pod.uid);
        } else {
            self.snapshot.upsert_pod(self.pod.clone());
        }
        self.present = !self.present;
        self.translation.update(&self.snapshot, &self.endpoints, &[change]);
        self.cache.render(self.translation.policy(), self.translation.changed())
    }

    /// The same change, translated and rendered in full (the reference).
    fn full(&self) -> Ruleset {
        render::render(&translate::translate(&self.snapshot, &self.endpoints, &Options::default()))
    }
}

/// A one-pod change, incrementally and in full, without nft: the two must agree (checked on
/// every run, outside the timings).
fn one_pod_change(cluster: &Cluster, rs: &Ruleset, runs: usize) -> anyhow::Result<Value> {
    let mut one_pod = OnePodChange::new(cluster, rs)?;
    let (mut incremental, mut full) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        for _ in 0..2 {
            let t = Instant::now();
            let inc = one_pod.toggle();
            incremental.push(t.elapsed());
            let t = Instant::now();
            let reference = one_pod.full();
            full.push(t.elapsed());
            if inc != reference || inc.to_text() != reference.to_text() {
                bail!("the incremental translation and render differ from the full one after: {}", one_pod.what);
            }
        }
    }
    Ok(json!({
        "what": one_pod.what,
        "translate_render_ms": stats(&incremental),
        "full_translate_render_ms": stats(&full),
        "vs_full": median(&incremental).as_secs_f64() / median(&full).as_secs_f64(),
    }))
}

/// What FlockNode's status costs the agent: the run policies (every local pod made a run's
/// pod) kept by the sync loop — from scratch (a full translation's sync, and the periodic
/// check), after one run pod's change and after one of their policies' change — and the
/// ruleset's SHA-256 (beside the loop).
fn node_status(cluster: &Cluster, rs: &Ruleset, runs: usize) -> anyhow::Result<Value> {
    use flock::agent::run_policies::{self, RunPolicies};
    let mut s = cluster.snapshot.clone();
    let local: Vec<Pod> = s.pods().filter(|p| p.node.as_deref() == Some(cluster.node.as_str()) && p.is_peer()).cloned().collect();
    for p in &local {
        let mut run = p.clone();
        run.labels.insert(flock::model::RUN_LABEL, format!("run-{}", p.name));
        s.upsert_pod(run);
    }
    s.record_changes();
    let Some(pod) = local.first() else { bail!("no local pod") };
    let Some(policy) = s.policies_in(&pod.namespace).next().cloned() else { bail!("no policy in {}", pod.namespace) };
    let (mut full, mut one_pod, mut one_policy, mut hash) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut version = 1;
    let mut map = Default::default();
    for i in 0..runs {
        let t = Instant::now();
        let mut kept = RunPolicies::new(&cluster.node);
        kept.sync(&s, version, None, false);
        full.push(t.elapsed());
        // A run pod relabelled.
        let mut changed = s.pod(&pod.uid).cloned().context("the run pod")?;
        changed.labels.insert("bench", i.to_string());
        s.take_changes();
        s.upsert_pod(changed);
        let changes = s.take_changes();
        version += 1;
        let t = Instant::now();
        kept.sync(&s, version, Some(&changes), false);
        one_pod.push(t.elapsed());
        // Its namespace's policy at a new generation.
        s.upsert_policy(flock::model::NetworkPolicy { generation: Some(i64::try_from(i).unwrap_or(0) + 2), ..policy.clone() });
        let changes = s.take_changes();
        version += 1;
        let t = Instant::now();
        map = kept.sync(&s, version, Some(&changes), false);
        one_policy.push(t.elapsed());
        let t = Instant::now();
        let digest = render::digest::sha256(rs);
        hash.push(t.elapsed());
        std::hint::black_box(digest);
    }
    if *map != run_policies::of(&s, &cluster.node) {
        bail!("the run policies kept differ from a fresh computation");
    }
    Ok(json!({
        "run_pods": local.len(),
        "run_policies": map.len(),
        "run_policies_full_ms": stats(&full),
        "run_policies_one_pod_change_ms": stats(&one_pod),
        "run_policies_one_policy_change_ms": stats(&one_policy),
        "ruleset_sha256_ms": stats(&hash),
    }))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn stats(v: &[Duration]) -> Value {
    json!({
        "median": ms(median(v)),
        "min": ms(v.iter().min().copied().unwrap_or_default()),
        "max": ms(v.iter().max().copied().unwrap_or_default()),
    })
}

/// The process's resident set size (`VmRSS`), if readable.
fn rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The `n` sets and maps with the most elements: name and element count (where the
/// ruleset's size goes).
fn largest_sets(rs: &Ruleset, n: usize) -> serde_json::Value {
    let mut sets: Vec<&render::Set> = rs
        .objects
        .iter()
        .filter_map(|o| match o {
            render::Object::Set(s) => Some(s),
            render::Object::Chain(_) => None,
        })
        .collect();
    sets.sort_by_key(|s| std::cmp::Reverse(s.elements.len()));
    sets.iter().take(n).map(|s| json!({"name": s.name, "elements": s.elements.len()})).collect()
}
