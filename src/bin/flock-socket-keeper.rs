//! flock-socket-keeper: holds sockets for flock-agent across the agent's restarts and
//! upgrades (today the DNS proxy's listeners), so that what arrives at them while no agent
//! runs waits in the kernel for the next one instead of being dropped. It reads no packet
//! and needs no capability; it only keeps descriptors open ([`flock::dns_proxy::keeper`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use flock::dns_proxy::keeper::{self, Store};
use flock::process::{LogFormat, init_logging};

#[derive(Parser, Debug)]
#[command(
    name = "flock-socket-keeper",
    version,
    about = "Holds flock-agent's DNS proxy listeners across the agent's restarts and upgrades"
)]
struct Args {
    /// The unix socket agents deposit and take descriptors at (mode 0600; only this
    /// process's user is served).
    #[arg(long, env = "FLOCK_SOCKET_KEEPER", default_value = keeper::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Log format.
    #[arg(long, env = "FLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "FLOCK_LOG", default_value = "info")]
    log: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args.log, args.log_format);
    let listener = match keeper::listen(&args.socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("flock-socket-keeper failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(socket = %args.socket.display(), "socket keeper listening");
    // The store lives on a thread of its own; the main thread waits for SIGTERM or SIGINT
    // (as a container's first process it has no default handlers) and ends the process,
    // which closes what it held.
    let socket = args.socket.clone();
    std::thread::spawn(move || {
        let e = keeper::serve(&listener, &std::sync::Mutex::new(Store::default()));
        tracing::error!(error = %e, socket = %socket.display(), "socket keeper: accepting failed; exiting");
        std::process::exit(1);
    });
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("flock-socket-keeper: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let mut stop = flock::process::stop_on_signals("the sockets it held close; the agent binds new ones");
        let _ = stop.wait_for(|s| *s).await;
    });
    ExitCode::SUCCESS
}
