//! flock-test-apiserver: the in-repo Kubernetes API server as a program, on a TCP address,
//! loaded with manifests — for the tests of flockctl's live mode, and for trying flockctl
//! live without a cluster. Plain HTTP, no authentication: a test fixture, never a cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use flock_test_apiserver::{ApiServer, Config, load};

#[derive(Parser)]
#[command(
    name = "flock-test-apiserver",
    version,
    about = "An in-memory Kubernetes API server loaded from manifests (plain HTTP, no auth): for tests and for trying flockctl live"
)]
struct Args {
    /// Address to listen on; port 0 picks a free one (the kubeconfig names it).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server here, once it serves (written whole: a reader
    /// never sees half a file).
    #[arg(long, value_name = "FILE")]
    kubeconfig_out: PathBuf,
    /// Manifest files or directories (multi-document YAML, List kinds) to load.
    #[arg(long = "manifests", short = 'f', value_name = "PATH", num_args = 1..)]
    manifests: Vec<PathBuf>,
}

fn kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: flock-test\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: flock-test\n  user: {{}}\ncontexts:\n- name: flock-test\n  context:\n    cluster: flock-test\n    user: flock-test\n\
         current-context: flock-test\n"
    )
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let server = ApiServer::start_tcp(args.listen, Config::default()).await?;
    load::install_crds(&server)?;
    let objects = load::load_manifests(&server, &args.manifests)?;
    let addr = server.local_addr().ok_or("the server has no TCP address")?;
    let tmp = args.kubeconfig_out.with_extension("tmp");
    std::fs::write(&tmp, kubeconfig(addr)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &args.kubeconfig_out).map_err(|e| format!("{}: {e}", args.kubeconfig_out.display()))?;
    eprintln!("flock-test-apiserver: serving http://{addr} ({objects} objects); kubeconfig {}", args.kubeconfig_out.display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    server.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        // This crate's errors name their cause in their message.
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
