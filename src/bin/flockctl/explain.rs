//! `flockctl explain`: why a flow is allowed or denied — offline from manifests (the
//! translator the agent runs), or `--live` from this node's table.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use flock::apply::Backend;
use flock::apply::kernel::NftCli;
use flock::explain::live::{self, LiveTable};
use flock::explain::{self, End, Explainer, Query};
use flock::model::Family;
use flock::model::{Protocol, Snapshot};
use flock::netns::Netns;
use flock::translate::Options;

use crate::cluster::ClusterArgs;

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Args)]
pub struct ExplainArgs {
    /// Manifest files or directories (multi-document YAML, List kinds): one or more, and
    /// repeatable. Without --manifests or --live: the cluster of the kubeconfig.
    #[arg(long = "manifests", short = 'f', value_name = "PATH", num_args = 1.., conflicts_with_all = ["live", "kubeconfig", "context"])]
    manifests: Vec<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Explain from this node's live table (`nft -s list table inet flock`; root) instead of
    /// the cluster's objects: what the kernel enforces now, for the part of the flow on this
    /// node.
    #[arg(long, conflicts_with_all = ["kubeconfig", "context"])]
    live: bool,
    /// The source: namespace/pod (or an address).
    #[arg(long, value_name = "NS/POD")]
    from: String,
    /// The destination: namespace/pod or an address.
    #[arg(long, value_name = "NS/POD|ADDRESS")]
    to: String,
    /// Destination port: a number, or the name of a port the destination pod declares for
    /// --protocol (as policies name them; with --manifests).
    #[arg(long, value_name = "PORT|NAME")]
    port: String,
    /// TCP, UDP or SCTP.
    #[arg(long, default_value = "TCP", value_parser = parse_protocol)]
    protocol: Protocol,
    /// IPv4 or IPv6 (pod to pod; default: IPv4 when both pods have one).
    #[arg(long, value_parser = parse_family)]
    family: Option<Family>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    output: Output,
    /// As the agent's --no-run-pod-isolation: pods labelled flock.dev/run that no policy
    /// selects are not egress-isolated.
    #[arg(long)]
    no_run_pod_isolation: bool,
    /// As flock-agent's --allow-audit-mode: policies annotated flock.dev/enforcement: audit
    /// are not enforced; the explanation also says what they would decide.
    #[arg(long)]
    allow_audit_mode: bool,
    /// Exit with status 1 when the verdict is Deny (0 when Allow; errors exit 2), for scripts.
    #[arg(long)]
    exit_code: bool,
}

/// A destination port: a number from 1 to 65535, or the name of a port the destination pod
/// declares for `protocol` (resolved on `snapshot`; a live table holds no pod specs).
fn resolve_port(spec: &str, snapshot: Option<&Snapshot>, to: (&End, &str), protocol: Protocol) -> anyhow::Result<u16> {
    let (to, to_text) = to;
    if let Ok(n) = spec.parse::<u32>() {
        return u16::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| anyhow::anyhow!("--port {spec}: a port is 1 to 65535"));
    }
    let Some(snapshot) = snapshot else {
        bail!("--port {spec:?}: a named port is resolved on the destination pod's spec, which --live does not have; give its number")
    };
    let pod = match to {
        End::Pod(r) => snapshot.pod_by_name(r),
        End::Address(ip) => snapshot.peer_owning(ip),
    };
    let Some(pod) = pod else { bail!("--port {spec:?}: a named port needs a destination pod, and --to {to_text} is none") };
    if let Some(p) = pod.ports.iter().find(|p| p.name.as_deref() == Some(spec) && p.protocol == protocol) {
        return Ok(p.port);
    }
    let mut named: Vec<String> =
        pod.ports.iter().filter_map(|p| p.name.as_ref().map(|n| format!("{n} ({} {})", p.protocol, p.port))).collect();
    named.sort();
    let named = if named.is_empty() { "none".to_string() } else { named.join(", ") };
    bail!("--port {spec:?}: pod {} declares no {protocol} port of that name (its named ports: {named})", pod.key())
}

pub(crate) fn parse_protocol(s: &str) -> Result<Protocol, String> {
    Protocol::parse(&s.to_ascii_uppercase()).ok_or_else(|| format!("{s:?}: expected TCP, UDP or SCTP"))
}

pub(crate) fn parse_family(s: &str) -> Result<Family, String> {
    Family::parse(s).ok_or_else(|| format!("{s:?}: expected IPv4 or IPv6"))
}

pub fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let (from, to) = (End::parse(&args.from)?, End::parse(&args.to)?);
    let (text, allowed) = if args.live {
        let query = Query {
            port: resolve_port(&args.port, None, (&to, &args.to), args.protocol)?,
            from,
            to,
            protocol: args.protocol,
            family: args.family,
        };
        let listing = NftCli::new(Netns::Current).list_table().context("listing table inet flock (are you root, on a node?)")?;
        let Some(listing) = listing else { bail!("there is no table inet flock here: is flock-agent running on this node?") };
        let node = flock::agent::revocation::node_addresses().context("listing this node's addresses")?;
        let mut table = LiveTable::parse(&listing)?.with_node_addresses(node);
        // What is left of each learned address (`nft -s` lists only the timeout): read over
        // netlink; without it the explanation shows the timeouts alone.
        let timed = table.timed_sets();
        if !timed.is_empty() {
            match flock::apply::netlink::NfSocket::open() {
                Ok(mut socket) => {
                    for set in timed {
                        match socket.dump_timed(&set) {
                            Ok(entries) => {
                                let entries: Vec<_> = entries.iter().map(|e| (e.addr, e.timeout, e.expires_in)).collect();
                                table.learned(&set, &entries);
                            }
                            Err(e) => eprintln!("warning: reading set {set}: {e}"),
                        }
                    }
                }
                Err(e) => eprintln!("warning: reading the learned addresses: {e}"),
            }
        }
        let e = table.explain(&query)?;
        let allowed = e.verdict == explain::Verdict::Allow;
        let text = match args.output {
            Output::Json => serde_json::to_string_pretty(&e)?,
            Output::Table => live::to_text(&e),
        };
        (text, allowed)
    } else {
        let snapshot = if args.manifests.is_empty() {
            crate::cluster::read(&args.cluster, "explain")?
        } else {
            let m = flock::source::files::load_manifests(&args.manifests).context("reading manifests")?;
            for w in &m.warnings {
                eprintln!("warning: {}", flock::text::visible(&w.to_string()));
            }
            m.into_snapshot()
        };
        let query = Query {
            port: resolve_port(&args.port, Some(&snapshot), (&to, &args.to), args.protocol)?,
            from,
            to,
            protocol: args.protocol,
            family: args.family,
        };
        let options = Options {
            isolate_run_pods: !args.no_run_pod_isolation,
            audit_mode: args.allow_audit_mode,
            dns_resolvers: None,
            overlay_port: None,
            overlay_node: None,
        };
        let e = Explainer::new(&snapshot, options).explain(&query)?;
        let allowed = e.verdict == explain::Verdict::Allow;
        let text = match args.output {
            Output::Json => serde_json::to_string_pretty(&e)?,
            Output::Table => explain::to_text(&e),
        };
        (text, allowed)
    };
    // Names and reasons from the cluster: nothing in them reaches the terminal as a control.
    println!("{}", flock::text::visible_lines(text.trim_end()));
    Ok(if args.exit_code && !allowed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
