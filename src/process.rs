//! What flock's daemons (flock-agent, flock-controller) share at process level: logging
//! setup, stopping on SIGTERM/SIGINT, and what the build is (version, commit). Metric
//! helpers both registries use live here too, and how every binary (flockctl too) prints
//! the error it exits with.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// This build's version (the crate's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this build is from, short: `FLOCK_COMMIT` at build time when set (the
/// image build passes it: its context has no `.git`), else `git rev-parse --short HEAD`,
/// else `unknown` (see `build.rs`).
pub const COMMIT: &str = env!("FLOCK_COMMIT");

/// Registers `build_info{version,commit}`, a gauge that is always 1 (the Prometheus idiom
/// for build metadata: join other series on it to see which build produced them), in
/// `registry`. flock-agent and flock-controller register it in their root registries,
/// prefixed `flock`, so it reads `flock_build_info` in both.
pub(crate) fn register_build_info(registry: &mut Registry) {
    let info = Family::<MetricLabels, Gauge>::default();
    info.get_or_create(&vec![("version".to_string(), VERSION.to_string()), ("commit".to_string(), COMMIT.to_string())]).set(1);
    registry.register("build_info", "The version and git commit of this build (always 1)", info);
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `filter` (`RUST_LOG` syntax; `info` if it does not parse),
/// as text or as JSON with the current span.
pub fn init_logging(filter: &str, format: LogFormat) {
    match format {
        LogFormat::Text => {
            let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
            tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).init();
        }
        LogFormat::Json => {
            // Only fails when a subscriber is set already (then that one logs).
            let _ = tracing::subscriber::set_global_default(json_subscriber(filter, std::io::stderr));
        }
    }
}

/// The JSON log format (one object per line, the event's fields under `fields`, the current
/// span), writing to `writer`: flock-agent's `--log-format json`, and what `flockctl whatif
/// --flows` reads back.
pub fn json_subscriber<W>(filter: &str, writer: W) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_writer(writer).with_env_filter(filter).json().with_current_span(true).finish()
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

/// An error and its causes on one line, `outer: cause: root`, each message once. flock's
/// error types either quote their source in their message or expose it as `source()`, never
/// both; other crates' types (kube's among them) may do both, so a cause whose message the
/// line already holds is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let message = c.to_string();
        if !line.contains(&message) {
            line.push_str(": ");
            line.push_str(&message);
        }
        cause = c.source();
    }
    line
}

/// A metric family's label set.
pub(crate) type MetricLabels = Vec<(String, String)>;

/// One label.
pub(crate) fn metric_label(k: &str, v: &str) -> MetricLabels {
    vec![(k.to_string(), v.to_string())]
}

/// Duration buckets from 1 ms, doubling, `count` of them.
pub(crate) fn duration_histogram(count: u16) -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, count))
}

/// The text exposition of `registry`.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut s = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut s, registry);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and an optional source.
    #[derive(Debug)]
    struct E(String, Option<Box<dyn std::error::Error + 'static>>);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = || std::io::Error::from_raw_os_error(2);
        let io_text = io().to_string();
        // Quotes its source and exposes it (kube's style), under a context that does not.
        let quoting = E(format!("cannot read x.yaml: {io_text}"), Some(Box::new(io())));
        let top = E("reading manifests".into(), Some(Box::new(quoting)));
        let line = error_chain(&top);
        assert_eq!(line, format!("reading manifests: cannot read x.yaml: {io_text}"));
        assert_eq!(line.matches("os error 2").count(), 1, "{line}");
        // Causes that are not quoted are all printed.
        let plain = E("starting".into(), Some(Box::new(E("no socket".into(), Some(Box::new(io()))))));
        assert_eq!(error_chain(&plain), format!("starting: no socket: {io_text}"));
    }

    #[test]
    fn build_info_is_one_gauge_named_flock_build_info() {
        let mut r = Registry::with_prefix("flock");
        register_build_info(&mut r);
        let text = encode(&r);
        assert!(text.contains("# TYPE flock_build_info gauge"), "{text}");
        let line = format!("flock_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1\n");
        assert!(text.contains(&line), "{line} missing in\n{text}");
        assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
        // build.rs only lets a plain token through.
        assert!(!COMMIT.is_empty() && COMMIT.len() <= 40, "{COMMIT:?}");
        assert!(COMMIT.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{COMMIT:?}");
    }
}
