//! `flockctl render`: manifests (or a live cluster) → one node's nft ruleset on stdout
//! (warnings on stderr).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use flock::apply::Backend;
use flock::apply::kernel::NftCli;
use flock::netns::Netns;
use flock::translate::{self, Options};

#[derive(Args)]
pub struct RenderArgs {
    /// Manifest files or directories (multi-document YAML, List kinds): one or more, and
    /// repeatable. Without --manifests: the cluster of the kubeconfig.
    #[arg(long = "manifests", short = 'f', value_name = "PATH", num_args = 1.., conflicts_with_all = ["kubeconfig", "context"])]
    manifests: Vec<PathBuf>,
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// The node to render for: its pods (by spec.nodeName) are the local endpoints.
    #[arg(long, value_name = "NAME")]
    node: String,
    /// Also validate the ruleset with `nft -c` in a new, empty network namespace (root).
    #[arg(long)]
    check: bool,
    /// Do not isolate the egress of pods labelled flock.dev/run that no policy selects.
    #[arg(long)]
    no_run_pod_isolation: bool,
    /// As flock-agent's --allow-audit-mode: policies annotated flock.dev/enforcement: audit
    /// (or in a namespace so annotated) are logged, not enforced.
    #[arg(long)]
    allow_audit_mode: bool,
    /// As flock-agent with its DNS proxy (on in the agent by default): the chains and sets
    /// that send the DNS of pods with domain rules through the proxy, the cluster DNS pods
    /// as trusted resolvers. Without it they are left out.
    #[arg(long)]
    dns_proxy: bool,
    #[command(flatten)]
    routing: RoutingArgs,
}

/// How the node takes other nodes' pods' traffic, as flock-agent's flags of the same names:
/// under an overlay the table takes VXLAN only from nodes, carrying their pods' packets.
#[derive(Args)]
pub struct RoutingArgs {
    /// As flock-agent's --routing: host-gw, vxlan or auto (under vxlan and auto the table
    /// guards the VXLAN port).
    #[arg(long, value_name = "ROUTING", default_value = "host-gw")]
    routing: flock::agent::routes::Routing,
    /// As flock-agent's --vxlan-port.
    #[arg(long, value_name = "PORT", default_value_t = 4789)]
    vxlan_port: u16,
}

impl RoutingArgs {
    /// The translator's `overlay_port`, as the agent sets it.
    pub fn overlay_port(&self) -> Option<u16> {
        (self.routing != flock::agent::routes::Routing::HostGw).then_some(self.vxlan_port)
    }
}

pub fn run(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let (snapshot, source) = if args.manifests.is_empty() {
        (crate::cluster::read(&args.cluster, "render")?, "the cluster")
    } else {
        let m = flock::source::files::load_manifests(&args.manifests).context("reading manifests")?;
        for w in &m.warnings {
            eprintln!("warning: {}", flock::text::visible(&w.to_string()));
        }
        (m.into_snapshot(), "the manifests")
    };
    let known_node = snapshot.node(&args.node).is_some() || snapshot.pods().any(|p| p.node.as_deref() == Some(&args.node));
    if !known_node {
        let mut nodes: Vec<String> =
            snapshot.nodes().map(|n| n.name.clone()).chain(snapshot.pods().filter_map(|p| p.node.clone())).collect();
        nodes.sort();
        nodes.dedup();
        let known = if nodes.is_empty() { format!("{source} name no node") } else { format!("known nodes: {}", nodes.join(", ")) };
        bail!("node {:?} is neither a Node in {source} nor the spec.nodeName of a pod ({known})", args.node);
    }
    for p in translate::validate_all(&snapshot) {
        // A policy problem quotes the policy's fields (a live cluster's): escaped.
        eprintln!("warning: {}", flock::text::visible(&p.to_string()));
    }
    let endpoints = snapshot.derived_endpoints(&args.node);
    let options = Options {
        isolate_run_pods: !args.no_run_pod_isolation,
        audit_mode: args.allow_audit_mode,
        dns_resolvers: args.dns_proxy.then(translate::ResolverPods::cluster_dns),
        overlay_port: args.routing.overlay_port(),
        overlay_node: Some(args.node.clone()),
    };
    let policy = translate::translate(&snapshot, &endpoints, &options);
    let dns = args.dns_proxy.then(|| flock::dns_proxy::DnsConfig::default().steer());
    let ruleset = flock::render::render_with(&policy, &flock::render::RenderOptions { dns, ..flock::render::RenderOptions::default() });
    let text = ruleset.to_text();
    if args.check {
        NftCli::new(Netns::Fresh).check(&text).context("nft -c rejected the rendered ruleset")?;
        let st = ruleset.stats();
        eprintln!("nft -c: ok ({} chains, {} rules, {} sets, {} elements)", st.chains, st.rules, st.sets, st.elements);
    }
    std::io::stdout().write_all(text.as_bytes()).context("writing to stdout")?;
    // The process ends next: freeing a large cluster object by object (0.2 s at 150k pods)
    // would only delay it.
    std::mem::forget(snapshot);
    std::mem::forget(policy);
    Ok(ExitCode::SUCCESS)
}
