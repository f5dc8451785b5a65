//! Reading a live cluster for the verbs that otherwise read manifests: the kubeconfig
//! (`--kubeconfig`, else `KUBECONFIG`, else `~/.kube/config`, else in-cluster; `--context`),
//! then one list of every resource the agent reads (`flock::source::kube::list_cluster`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

use flock::model::Snapshot;

/// Where the cluster is.
#[derive(Args, Clone, Default)]
pub struct ClusterArgs {
    /// Read the cluster through this kubeconfig (without --manifests; default: KUBECONFIG,
    /// else ~/.kube/config, else the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// The API client, and the API server's address as the kubeconfig names it (errors say
/// which server did not answer: a wrong kubeconfig is otherwise only "client error (Connect)").
pub async fn client(args: &ClusterArgs) -> anyhow::Result<(kube::Client, String)> {
    let options = KubeConfigOptions { context: args.context.clone(), ..KubeConfigOptions::default() };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.with_context(|| format!("kubeconfig {}", path.display()))?
        }
        (None, Some(context)) => {
            kube::Config::from_kubeconfig(&options).await.with_context(|| format!("kubeconfig context {context:?}"))?
        }
        (None, None) => kube::Config::infer().await.context("finding the cluster (KUBECONFIG, ~/.kube/config, in-cluster)")?,
    };
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("building the API client")?;
    Ok((client, server))
}

/// The cluster's snapshot, for `verb` (which errors name). Objects flock cannot read are
/// warned about on stderr.
pub fn read(args: &ClusterArgs, verb: &str) -> anyhow::Result<Snapshot> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let listed = runtime
        .block_on(async {
            let (client, server) = client(args).await?;
            flock::source::kube::list_cluster(&client).await.with_context(|| format!("the API server at {server}"))
        })
        .with_context(|| format!("{verb}: reading the cluster"))?;
    for u in &listed.unreadable {
        eprintln!("warning: left out (flock cannot read it): {}", flock::text::visible(&u.to_string()));
    }
    Ok(listed.snapshot)
}
