//! What flock's daemons (flock-agent, flock-controller) share at process level: logging
//! setup and stopping on SIGTERM/SIGINT. Metric helpers both registries use live here too.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// `--log-format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `filter` (`RUST_LOG` syntax; `info` if it does not parse),
/// as text or as JSON with the current span.
pub fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

/// A stop signal that turns true on SIGTERM or SIGINT; `what_stays` is logged with it (what
/// the process leaves in place when it exits). Call from within a Tokio runtime.
pub fn stop_on_signals(what_stays: &'static str) -> watch::Receiver<bool> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping ({what_stays} stay in place)"),
            _ = int.recv() => tracing::info!("SIGINT: stopping ({what_stays} stay in place)"),
        }
        let _ = stop_tx.send(true);
    });
    stop
}

/// A metric family's label set.
pub type MetricLabels = Vec<(String, String)>;

/// One label.
pub fn metric_label(k: &str, v: &str) -> MetricLabels {
    vec![(k.to_string(), v.to_string())]
}

/// Duration buckets from 1 ms, doubling, `count` of them.
pub fn duration_histogram(count: u16) -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, count))
}

/// The text exposition of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut s = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut s, registry);
    s
}
