//! `flockctl sim`: build a simulated cluster from manifests, probe it, print a truth table
//! (or JSON), tear it down.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde_json::json;

use flock::model::Family;
use flock::model::Protocol;
use flock::sim::{Cell, HostSpec, NodeDenial, Outcome, ProbeSpec, Sim, SimOptions};

#[derive(Args)]
pub struct SimArgs {
    /// Manifest files or directories (Nodes with podCIDRs and InternalIPs, Namespaces, Pods,
    /// NetworkPolicies): one or more, and repeatable.
    #[arg(long = "manifests", short = 'f', value_name = "PATH", num_args = 1.., required_unless_present = "cleanup")]
    manifests: Vec<PathBuf>,
    /// A probe `PORT/PROTO[/FAMILY]` (e.g. `80/TCP`, `53/UDP/IPv6`; without FAMILY, each
    /// destination's primary address); repeatable. Default: every declared container port,
    /// in each family the pods have.
    #[arg(long = "probe", value_name = "PORT/PROTO[/FAMILY]", value_parser = parse_probe)]
    probes: Vec<ProbeSpec>,
    /// A non-pod host on the fabric, probed as destination `host/NAME`; repeatable.
    #[arg(long = "host", value_name = "NAME=ADDR[,ADDR]")]
    hosts: Vec<HostSpec>,
    /// Output format: a truth table per probe, or one JSON document.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Leave the namespaces, links and rules in place for inspection; later simulations
    /// leave them too, until `--cleanup`.
    #[arg(long)]
    keep: bool,
    /// After probing, print `nft list table inet flock` of this node (with `-o json`: in the
    /// document, under `rulesets`); repeatable.
    #[arg(long, value_name = "NODE")]
    show_ruleset: Vec<String>,
    /// Only remove what earlier simulations left behind (kept or crashed; never a running
    /// one), then exit.
    #[arg(long)]
    cleanup: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// Options shared by `sim` and `conformance`.
#[derive(Args, Clone)]
pub struct CommonArgs {
    /// Probe timeout in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Probes in flight at once.
    #[arg(long, default_value_t = 48)]
    pub parallel: usize,
    /// Directory holding flock-cni (default: next to flockctl).
    #[arg(long, value_name = "DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// Directory with the loopback and host-local CNI plugins.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/cni")]
    pub cni_path: PathBuf,
    /// How the simulated nodes are connected: `l2` (one segment) or `routed` (each node
    /// behind a router: host-gw cannot reach another node).
    #[arg(long, default_value = "l2")]
    pub underlay: flock::sim::Underlay,
    /// On a routed underlay: `validated` (the router forwards only what a node or host sends
    /// from its own addresses, a node's also from its pod CIDRs, as cloud VPCs do) or
    /// `allowed` (it forwards forged sources too: a node can send VXLAN as another).
    #[arg(long, default_value = "validated")]
    pub underlay_spoofing: flock::sim::UnderlaySpoofing,
    /// How the agents reach other nodes' pods: host-gw, vxlan or auto (flock-agent's
    /// `--routing`).
    #[arg(long, default_value = "host-gw")]
    pub routing: flock::agent::routes::Routing,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn parse_probe(s: &str) -> Result<ProbeSpec, String> {
    let parts: Vec<&str> = s.split('/').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(format!("{s:?}: expected PORT/PROTO[/FAMILY]"));
    }
    let port: u16 = parts[0].parse().ok().filter(|p| *p > 0).ok_or(format!("{:?} is not a port", parts[0]))?;
    let protocol = Protocol::parse(&parts[1].to_ascii_uppercase()).ok_or(format!("{:?} is not TCP, UDP or SCTP", parts[1]))?;
    let family = match parts.get(2) {
        None => None,
        Some(f) => Some(Family::parse(f).ok_or(format!("{f:?} is not IPv4 or IPv6"))?),
    };
    Ok(ProbeSpec { port, protocol, family })
}

/// Checks what a simulation needs, with what to do about it.
pub fn preflight(common: &CommonArgs) -> anyhow::Result<SimOptions> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the simulated cluster needs root (it creates network namespaces and nft rules): run it as root, e.g. sudo -E");
    }
    for (tool, pkg) in [("nft", "nftables"), ("ip", "iproute2"), ("sysctl", "procps")] {
        if std::process::Command::new(tool).arg("-V").output().is_err()
            && std::process::Command::new(tool).arg("--version").output().is_err()
        {
            bail!("{tool} is missing: apt-get install -y {pkg}");
        }
    }
    for plugin in ["loopback", "host-local"] {
        if !common.cni_path.join(plugin).is_file() {
            bail!(
                "CNI plugin {plugin} not found in {}: apt-get install -y containernetworking-plugins (or --cni-path DIR)",
                common.cni_path.display()
            );
        }
    }
    let cni_bin_dir = match &common.cni_bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe().context("locating flockctl")?.parent().map(PathBuf::from).unwrap_or_default(),
    };
    if !cni_bin_dir.join("flock-cni").is_file() {
        bail!("flock-cni not found in {} (build it with `cargo build -p flock-cni`, or pass --cni-bin-dir)", cni_bin_dir.display());
    }
    let mut o = SimOptions::new(cni_bin_dir).with_cluster_dns();
    o.cni_path = vec![common.cni_path.clone()];
    o.probe_timeout = Duration::from_millis(common.timeout_ms);
    o.parallelism = common.parallel.max(1);
    o.underlay = common.underlay;
    o.underlay_spoofing = common.underlay_spoofing;
    o.routing.routing = common.routing;
    Ok(o)
}

/// How long an interrupted simulation may take to unwind before it is removed under its
/// feet (a probe or a CNI operation that ignores the removed namespaces).
const UNWIND_LIMIT: Duration = Duration::from_secs(10);

/// On SIGHUP, SIGINT or SIGTERM: stop this process's simulations (kept or not: an
/// interrupted run is not worth inspecting) so that they unwind at once; [`exit_if_interrupted`]
/// then removes what is left. Runs on its own task, so it acts at once even while probes
/// block a worker; if the simulation has not unwound within [`UNWIND_LIMIT`], it removes
/// everything and exits itself.
pub fn cleanup_on_interrupt() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        let number = tokio::select! {
            _ = hup.recv() => nix::libc::SIGHUP,
            _ = int.recv() => nix::libc::SIGINT,
            _ = term.recv() => nix::libc::SIGTERM,
        };
        flock::sim::fabric::interrupt(number);
        // A CNI plugin started just before the interrupt would wait for its agent's answer.
        let started = Instant::now();
        while started.elapsed() < UNWIND_LIMIT {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flock::sim::fabric::kill_children();
        }
        std::process::exit(finish_interrupt().map_or(1, i32::from));
    });
    Ok(())
}

/// After an interrupt ([`cleanup_on_interrupt`]): removes what the simulation left, says so
/// and returns the exit code (128 + the signal number). Call once nothing runs any more.
pub fn exit_if_interrupted() -> Option<ExitCode> {
    finish_interrupt().map(ExitCode::from)
}

fn finish_interrupt() -> Option<u8> {
    let number = flock::sim::fabric::interrupted()?;
    flock::sim::fabric::kill_children();
    flock::sim::fabric::sweep_own();
    let name = nix::sys::signal::Signal::try_from(number).map_or("a signal", |s| s.as_str());
    // After a hangup stderr may be gone: a failed write must not stop the exit.
    let _ = writeln!(std::io::stderr(), "interrupted ({name}): the simulation was removed");
    Some(u8::try_from(128 + number).unwrap_or(u8::MAX))
}

/// Tells about simulations kept by earlier runs (`--keep`), which stay until `--cleanup`.
pub fn note_kept(sim: &Sim) {
    let kept = sim.kept_elsewhere();
    if !kept.is_empty() {
        let runs: Vec<String> = kept.iter().map(|(run, n)| format!("{}{run}-* ({n} namespaces)", flock::sim::fabric::PREFIX)).collect();
        eprintln!(
            "note: simulations kept by earlier runs are still in place: {}; remove them with `flockctl sim --cleanup`",
            runs.join(", ")
        );
    }
}

/// A multi-threaded runtime for the agents and the blocking probe workers.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().context("starting the async runtime")
}

pub fn run(args: &SimArgs) -> anyhow::Result<ExitCode> {
    if args.cleanup {
        let swept = flock::sim::fabric::sweep(flock::sim::fabric::Sweep::AlsoKept);
        eprintln!("removed {} network namespaces left by earlier simulations (kept or crashed)", swept.removed);
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = preflight(&args.common)?;
    let m = flock::source::files::load_manifests(&args.manifests).context("reading manifests")?;
    for w in &m.warnings {
        eprintln!("warning: {}", flock::text::visible(&w.to_string()));
    }
    let snapshot = m.to_snapshot();
    for p in flock::translate::validate_all(&snapshot) {
        eprintln!("warning: {p}");
    }
    if let Some(node) = args.show_ruleset.iter().find(|n| snapshot.node(n).is_none()) {
        let nodes: Vec<String> = snapshot.nodes().map(|n| n.name.clone()).collect();
        bail!("--show-ruleset {node}: no such Node in the manifests (nodes: {})", nodes.join(", "));
    }
    opts.hosts = args.hosts.clone();
    let mut host_ports: Vec<(u16, Protocol)> = args.probes.iter().map(|p| (p.port, p.protocol)).collect();
    if host_ports.is_empty() {
        host_ports = snapshot.pods().flat_map(|p| p.ports.iter().map(|c| (c.port, c.protocol))).collect();
    }
    host_ports.sort();
    host_ports.dedup();
    opts.host_ports = host_ports;
    let rt = runtime()?;
    rt.block_on(async {
        cleanup_on_interrupt()?;
        let started = Instant::now();
        let mut sim = Sim::build(snapshot, opts).await?;
        eprintln!(
            "built {} pods on {} nodes in {:.2}s",
            sim.pod_names().len(),
            sim.snapshot().nodes().count(),
            started.elapsed().as_secs_f64()
        );
        note_kept(&sim);
        if args.keep {
            sim.keep()?;
        }
        let probes = if args.probes.is_empty() {
            let fams = sim.families();
            sim.declared_ports()
                .into_iter()
                .flat_map(|(port, protocol)| fams.iter().map(move |f| ProbeSpec { port, protocol, family: Some(*f) }))
                .collect()
        } else {
            args.probes.clone()
        };
        let pods = sim.pod_names();
        let mut dests = pods.clone();
        dests.extend(sim.host_names());
        // What the kernel logs as denied during the probes, read by each node's agent.
        let collector = sim.collect_denials();
        let mut results = Vec::new();
        for spec in &probes {
            let cells = sim.probe(*spec, &pods, &dests)?;
            results.push((*spec, cells));
        }
        let (mut denied, lost) = collector.take(Duration::from_millis(300)).await;
        // Connections logged as allowed (flock.dev/log-allowed) are not denials.
        denied.retain(|d| d.denial.reason != flock::nflog::denial::Reason::Allowed);
        let denied = group_denials(&denied);
        if lost > 0 {
            eprintln!("warning: {lost} denial records were not collected (the collector fell behind)");
        }
        let mut rulesets = Vec::new();
        for node in &args.show_ruleset {
            let ns = sim.node_netns(node).with_context(|| format!("no node {node} in the simulation"))?;
            let listing = flock::sim::fabric::run(&["ip", "netns", "exec", &ns, "nft", "list", "table", "inet", "flock"])?;
            rulesets.push((node.clone(), listing));
        }
        // stdout is the result alone: one table per probe then the listings, or one JSON
        // document holding both.
        match args.output {
            Format::Table => {
                for (spec, cells) in &results {
                    println!("{}", truth_table(*spec, cells, &pods, &dests));
                }
                print!("{}", denial_summary(&denied));
                for (node, listing) in &rulesets {
                    println!("# nft list table inet flock   (node {node})\n{listing}");
                }
            }
            Format::Json => {
                let mut doc = to_json(&results, &rulesets);
                doc["denied"] = denied.iter().map(denial_json).collect::<Vec<_>>().into();
                println!("{doc}");
            }
        }
        if args.keep {
            let roles = sim.netns_roles();
            eprintln!("kept: these network namespaces; later simulations leave them; remove with `flockctl sim --cleanup`");
            for (role, ns) in &roles {
                eprintln!("  {role}: {ns}");
            }
            if let Some((role, ns)) = roles.first() {
                eprintln!("inspect with e.g. `ip netns exec {ns} nft list ruleset` ({role})");
            }
        }
        sim.teardown().await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Identical denials (same node and record) once each, with how many times they were
/// logged, in order of first arrival.
fn group_denials(denied: &[NodeDenial]) -> Vec<(NodeDenial, usize)> {
    let mut out: Vec<(NodeDenial, usize)> = Vec::new();
    for d in denied {
        match out.iter_mut().find(|(x, _)| x == d) {
            Some((_, n)) => *n += 1,
            None => out.push((d.clone(), 1)),
        }
    }
    out
}

/// A denial in the JSON document: the record, its node and how often it was logged.
fn denial_json((d, count): &(NodeDenial, usize)) -> serde_json::Value {
    let mut v = serde_json::to_value(&d.denial).unwrap_or_default();
    v["node"] = json!(d.node);
    v["count"] = json!(count);
    v
}

/// A few lines under the truth tables: per pod and direction (or kind of denial), how many
/// packets the kernel logged as denied, from how many peers, and what denies there.
fn denial_summary(denied: &[(NodeDenial, usize)]) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    if denied.is_empty() {
        return "denied: the kernel logged no denial during the probes\n".into();
    }
    #[derive(Default)]
    struct Seen {
        packets: usize,
        peers: Vec<String>,
        policies: Vec<String>,
    }
    let mut by: BTreeMap<(String, String), Seen> = BTreeMap::new();
    for (n, count) in denied {
        let d = &n.denial;
        let what = match (&d.pod, d.direction) {
            (Some(pod), Some(dir)) => format!("{dir} of {pod}"),
            _ => d.direction_label().to_string(),
        };
        let e = by.entry((what, n.node.clone())).or_default();
        e.packets += count;
        let peer = if d.direction == Some("egress") { &d.to } else { &d.from };
        if !e.peers.contains(peer) {
            e.peers.push(peer.clone());
        }
        for p in &d.policies {
            if !e.policies.contains(p) {
                e.policies.push(p.clone());
            }
        }
    }
    let total: usize = denied.iter().map(|(_, c)| c).sum();
    let n = |count: usize, what: &str| if count == 1 { format!("1 {what}") } else { format!("{count} {what}s") };
    let mut out = format!("denied (logged by the kernel during the probes, rate-limited): {}\n", n(total, "packet"));
    for ((what, node), seen) in &by {
        let _ = write!(out, "  {what} (node {node}): {}, {}", n(seen.packets, "packet"), n(seen.peers.len(), "peer"));
        if !seen.policies.is_empty() {
            let _ = write!(out, "; {}", seen.policies.join(", "));
        }
        out.push('\n');
    }
    out
}

/// Cells that are not probed: no address of the probe's family on one side, and a pod to
/// itself.
const NO_ADDRESS: (char, &str) = ('~', "not probed: no address of this family on one side");
const ITSELF: (char, &str) = ('-', "not probed: the pod itself");

/// One probe's truth table: a title saying what was probed, rows (sources) by columns
/// (destinations) with the axes labelled, and a legend of the symbols it uses.
fn truth_table(spec: ProbeSpec, cells: &[Cell], rows: &[String], cols: &[String]) -> String {
    use std::fmt::Write as _;
    const CORNER: &str = "from \\ to";
    let mut families: Vec<Family> = cells.iter().map(|c| c.family).collect();
    families.sort();
    families.dedup();
    let over = match (spec.family, families.as_slice()) {
        (Some(f), _) | (None, &[f]) => f.as_str().to_string(),
        // `--probe PORT/PROTO` without a family on a cluster with both: each destination's
        // primary address (its first podIP) decides.
        _ => "each destination's primary address (IPv4 or IPv6)".to_string(),
    };
    let row_w = rows.iter().map(String::len).chain([CORNER.len()]).max().unwrap_or(0);
    let col_w = cols.iter().map(String::len).max().unwrap_or(1);
    let mut used = Vec::new();
    let mut out = String::new();
    let _ = writeln!(out, "{} port {}, {over}", spec.protocol, spec.port);
    let _ = write!(out, "{CORNER:row_w$}");
    for c in cols {
        let _ = write!(out, " {c:>col_w$}");
    }
    out.push('\n');
    for r in rows {
        let _ = write!(out, "{r:row_w$}");
        for c in cols {
            let sym = if r == c {
                ITSELF.0
            } else {
                cells.iter().find(|x| &x.from == r && &x.to == c).and_then(|x| x.outcome).map_or(NO_ADDRESS.0, |o| o.symbol())
            };
            if !used.contains(&sym) {
                used.push(sym);
            }
            let _ = write!(out, " {sym:>col_w$}");
        }
        out.push('\n');
    }
    let legend = Outcome::ALL.iter().map(|o| (o.symbol(), o.meaning())).chain([NO_ADDRESS, ITSELF]);
    for (sym, meaning) in legend.filter(|(s, _)| used.contains(s)) {
        let _ = writeln!(out, "  {sym}  {meaning}");
    }
    out
}

/// `{"probes": [...]}`, and `"rulesets": {NODE: LISTING}` when `--show-ruleset` asked.
fn to_json(results: &[(ProbeSpec, Vec<Cell>)], rulesets: &[(String, String)]) -> serde_json::Value {
    let probes: Vec<serde_json::Value> = results
        .iter()
        .flat_map(|(spec, cells)| {
            // One entry per family actually probed (a probe without a family may mix them).
            let mut fams: Vec<Family> = cells.iter().filter(|c| c.outcome.is_some()).map(|c| c.family).collect();
            fams.sort();
            fams.dedup();
            fams.into_iter().map(move |fam| {
                let res: Vec<serde_json::Value> = cells
                    .iter()
                    .filter(|c| c.family == fam)
                    .filter_map(|c| {
                        c.outcome.map(|o| json!({"from": c.from, "to": c.to, "connected": o == Outcome::Connected, "outcome": o.as_str()}))
                    })
                    .collect();
                json!({"port": spec.port, "protocol": spec.protocol.as_k8s(), "family": fam.as_str(), "results": res})
            })
        })
        .collect();
    let mut out = json!({"probes": probes});
    if !rulesets.is_empty() {
        out["rulesets"] = rulesets.iter().map(|(node, listing)| (node.clone(), json!(listing))).collect::<serde_json::Map<_, _>>().into();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_specs() {
        assert_eq!(parse_probe("80/TCP").unwrap(), ProbeSpec { port: 80, protocol: Protocol::Tcp, family: None });
        assert_eq!(parse_probe("53/udp/IPv6").unwrap(), ProbeSpec { port: 53, protocol: Protocol::Udp, family: Some(Family::V6) });
        assert!(parse_probe("80").is_err());
        assert!(parse_probe("0/TCP").is_err());
        assert!(parse_probe("80/ICMP").is_err());
        assert!(parse_probe("80/TCP/IPv5").is_err());
    }

    #[test]
    fn truth_tables_label_axes_and_explain_the_symbols_they_use() {
        let cell = |from: &str, to: &str, family, outcome| Cell { from: from.into(), to: to.into(), family, outcome };
        let pods = vec!["x/a".to_string(), "x/b".to_string()];
        let mut dests = pods.clone();
        dests.push("host/internet".into());
        let cells = vec![
            cell("x/a", "x/b", Family::V4, Some(Outcome::Timeout)),
            cell("x/a", "host/internet", Family::V6, Some(Outcome::Connected)),
            cell("x/b", "x/a", Family::V4, Some(Outcome::Timeout)),
            cell("x/b", "host/internet", Family::V6, None),
        ];
        let spec = ProbeSpec { port: 80, protocol: Protocol::Tcp, family: None };
        let want = "\
TCP port 80, each destination's primary address (IPv4 or IPv6)
from \\ to           x/a           x/b host/internet
x/a                   -             X             .
x/b                   X             -             ~
  .  connected
  X  timeout: no answer (a NetworkPolicy drop is silent)
  ~  not probed: no address of this family on one side
  -  not probed: the pod itself
";
        assert_eq!(truth_table(spec, &cells, &pods, &dests), want);
        let v4 = truth_table(ProbeSpec { family: Some(Family::V4), ..spec }, &cells[..1], &pods[..1], &pods);
        assert!(v4.starts_with("TCP port 80, IPv4\n"), "{v4}");
    }
}
