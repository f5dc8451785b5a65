//! flock-controller: the Deployment that turns each `Run` (flock.dev/v1alpha1) into its own
//! egress NetworkPolicy from its `RunProfile`, which flock-agent enforces. This binary parses
//! flags (each with an environment fallback), builds the client, makes the start-up
//! decisions, serves `/healthz`, `/readyz` and `/metrics`, and runs the controllers while it
//! holds the leader Lease. The logic is `flock::controller`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use flock::agent::http::{ListenAddr, serve_with};
use flock::controller::audit::Retention;
use flock::controller::metrics::Metrics;
use flock::controller::probe::{AgentRef, EnforceMode};
use flock::controller::render::{ClusterConfig, DnsConfig};
use flock::controller::slices::SliceOptions;
use flock::controller::{self, Health, Options};
use flock::crd;
use flock::lease::{self, Elector, LeaseSettings};
use flock::process::{LogFormat, init_logging, stop_on_signals};
use flock::translate::selector::{validate_label_key, validate_label_value};
use ipnet::IpNet;

#[derive(Parser, Debug)]
#[command(
    name = "flock-controller",
    version,
    about = "flock's companion controller: one egress NetworkPolicy per Run, from its RunProfile"
)]
struct Args {
    /// Whether new runs' policies are enforced: auto (when a flock-agent DaemonSet, or
    /// another NetworkPolicy enforcer, is found at start), on or off. Each run pins the
    /// decision of its first reconcile.
    #[arg(long, env = "FLOCK_ENFORCE", default_value = "auto", value_parser = parse_mode)]
    enforce: EnforceMode,
    /// The cluster's pod CIDRs (comma-separated; both families on dual-stack clusters),
    /// excepted from the internet rule.
    #[arg(long, env = "FLOCK_CLUSTER_POD_CIDRS", value_delimiter = ',', default_value = "10.244.0.0/16")]
    cluster_pod_cidr: Vec<IpNet>,
    /// The cluster's Service CIDRs (comma-separated), excepted from the internet rule.
    #[arg(long, env = "FLOCK_CLUSTER_SERVICE_CIDRS", value_delimiter = ',', default_value = "10.96.0.0/12")]
    cluster_service_cidr: Vec<IpNet>,
    /// Namespace of the cluster DNS pods.
    #[arg(long, env = "FLOCK_DNS_NAMESPACE", default_value = "kube-system")]
    dns_namespace: String,
    /// Labels of the cluster DNS pods (comma-separated key=value).
    #[arg(long, env = "FLOCK_DNS_POD_LABELS", default_value = "k8s-app=kube-dns", value_parser = parse_labels)]
    dns_pod_labels: BTreeMap<String, String>,
    /// Namespace of the flock-agent DaemonSet (the auto probe).
    #[arg(long, env = "FLOCK_AGENT_NAMESPACE", default_value = "flock-system")]
    agent_namespace: String,
    /// Name of the flock-agent DaemonSet.
    #[arg(long, env = "FLOCK_AGENT_DAEMONSET", default_value = "flock-agent")]
    agent_daemonset: String,
    /// Requeue period of runs whose policy is applied (a safety net: deletions and edits of
    /// policies are seen at once).
    #[arg(long, env = "FLOCK_RESYNC_SECONDS", default_value_t = 600)]
    resync_seconds: u64,
    /// A Warning Event `EnforcementDelayed` when nodes hosting a run's pods have not reported
    /// enforcing its policy's current generation after this many seconds.
    #[arg(long, env = "FLOCK_ENFORCED_TIMEOUT_SECONDS", default_value_t = 60)]
    enforced_timeout_seconds: u64,
    /// AuditEvents older than this many days are deleted.
    #[arg(long, env = "FLOCK_AUDIT_MAX_AGE_DAYS", default_value_t = 90)]
    audit_max_age_days: u64,
    /// At most this many AuditEvents are kept per run (the newest).
    #[arg(long, env = "FLOCK_AUDIT_MAX_PER_RUN", default_value_t = 100)]
    audit_max_per_run: usize,
    /// Write PodSlices: every pod's policy identity, batched, for agents that read them
    /// (flock-agent --pod-source slices) instead of watching every Pod.
    #[arg(long, env = "FLOCK_POD_SLICES")]
    pod_slices: bool,
    /// Pods per PodSlice (1-1000).
    #[arg(long, env = "FLOCK_POD_SLICE_MAX_PODS", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pod_slice_max_pods: u16,
    /// How long (milliseconds) a namespace's pod changes gather before its PodSlices are written.
    #[arg(long, env = "FLOCK_POD_SLICE_WINDOW_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pod_slice_window_ms: u64,
    /// The most PodSlice writes a second (a burst of twice as many).
    #[arg(long, env = "FLOCK_POD_SLICE_WRITES_PER_SECOND", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pod_slice_writes_per_second: u32,
    /// Address of /healthz, /readyz and /metrics (HOST:PORT or unix:/path).
    #[arg(long, env = "FLOCK_METRICS_ADDRESS", default_value = "[::]:9782")]
    metrics_address: ListenAddr,
    /// Run without leader election (one replica only).
    #[arg(long, env = "FLOCK_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// The leader Lease (in --namespace).
    #[arg(long, env = "FLOCK_LEASE_NAME", default_value = "flock-controller")]
    lease_name: String,
    /// How long a Lease not renewed stays with its holder.
    #[arg(long, env = "FLOCK_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    /// The leader stops reconciling when it has not renewed for this long (shorter than the
    /// lease duration).
    #[arg(long, env = "FLOCK_RENEW_DEADLINE_SECONDS", default_value_t = 10)]
    renew_deadline_seconds: u64,
    /// The leader renews, and candidates try, this often (shorter than the renew deadline).
    #[arg(long, env = "FLOCK_RETRY_PERIOD_SECONDS", default_value_t = 2)]
    retry_period_seconds: u64,
    /// The controller's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flock-system")]
    namespace: String,
    /// This replica's name (downward API): its leader identity and Events' instance.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Log format.
    #[arg(long, env = "FLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "FLOCK_LOG", default_value = "info")]
    log: String,
    /// Print the CRDs (RunProfile, Run, AuditEvent, FlockNode, PodSlice) as YAML and exit.
    #[arg(long, env = "FLOCK_PRINT_CRDS")]
    print_crds: bool,
}

fn parse_mode(s: &str) -> Result<EnforceMode, String> {
    s.parse()
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or(format!("{pair:?}: expected key=value"))?;
        validate_label_key(k).and_then(|()| validate_label_value(v)).map_err(|e| format!("{pair:?} is not a valid label: {e}"))?;
        out.insert(k.to_string(), v.to_string());
    }
    if out.is_empty() {
        return Err("at least one label is required".into());
    }
    Ok(out)
}

impl Args {
    /// `--enforced-timeout-seconds` (at least 1 s).
    fn enforced_timeout(&self) -> Duration {
        Duration::from_secs(self.enforced_timeout_seconds.max(1))
    }

    /// `--audit-max-age-days` and `--audit-max-per-run` (each at least 1).
    fn retention(&self) -> Retention {
        Retention {
            max_age: Duration::from_secs(self.audit_max_age_days.max(1).saturating_mul(24 * 3600)),
            max_per_run: self.audit_max_per_run.max(1),
            ..Retention::default()
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_crds {
        return match crd::crd_files() {
            Ok(files) => {
                for (i, (_, text)) in files.iter().enumerate() {
                    print!("{}{text}", if i > 0 { "---\n" } else { "" });
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("flock-controller: cannot print the CRDs: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(&args.log, args.log_format);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("flock-controller failed: {}", flock::process::error_chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// The pod's hostname (its name, in Kubernetes) when POD_NAME is not set.
fn identity(args: &Args) -> String {
    args.pod_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "flock-controller".into())
    })
}

fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let config = kube::Config::infer().await.context("reading the Kubernetes client configuration (in-cluster or KUBECONFIG)")?;
        let url = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        let id = identity(&args);
        let opts = Options {
            enforce: args.enforce,
            agent: AgentRef { namespace: args.agent_namespace.clone(), name: args.agent_daemonset.clone() },
            cluster: ClusterConfig {
                pod_cidrs: args.cluster_pod_cidr.clone(),
                service_cidrs: args.cluster_service_cidr.clone(),
                dns: DnsConfig { namespace: args.dns_namespace.clone(), pod_labels: args.dns_pod_labels.clone() },
                api_server: Default::default(),
            },
            api_server_url: Some(url),
            resync: Duration::from_secs(args.resync_seconds.max(1)),
            instance: id.clone(),
            namespace: args.namespace.clone(),
            enforced_timeout: args.enforced_timeout(),
            retention: args.retention(),
            clock: flock::controller::reconcile::system_clock(),
            slices: args.pod_slices.then(|| SliceOptions {
                max_pods: usize::from(args.pod_slice_max_pods),
                window: Duration::from_millis(args.pod_slice_window_ms),
                writes_per_second: args.pod_slice_writes_per_second,
                ..SliceOptions::default()
            }),
        };

        let stop = stop_on_signals("policies");

        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::default());
        let server =
            tokio::spawn(serve_with(args.metrics_address.clone(), controller::handler(health.clone(), metrics.clone()), stop.clone()));

        let (version, commit) = (flock::process::VERSION, flock::process::COMMIT);
        tracing::info!(identity = %id, mode = args.enforce.as_str(), version, commit, "flock-controller starting");
        // The control plane may be restarting or not serve its endpoints yet: wait for it
        // (not Ready meanwhile) rather than exit into a restart loop.
        let Some(startup) = controller::start_until_ready(&client, &opts, stop.clone()).await.context("starting")? else {
            server.abort();
            return Ok(());
        };
        health.started.store(true, Ordering::SeqCst);

        if args.no_leader_election {
            health.leading.store(true, Ordering::SeqCst);
            metrics.leader(true);
            controller::run(client, startup, &opts, metrics.clone(), stop).await;
        } else {
            let retry = Duration::from_secs(args.retry_period_seconds);
            let settings = LeaseSettings {
                lease_duration: Duration::from_secs(args.lease_duration_seconds),
                renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
                renew_period: retry,
                candidate_period: retry,
                ..LeaseSettings::new(&args.namespace, &args.lease_name)
            };
            let elector = Elector::new(client.clone(), settings, &id, "the leader").context("leader election")?;
            let (h, m) = (health.clone(), metrics.clone());
            let on_change = move |leading: bool| {
                h.leading.store(leading, Ordering::SeqCst);
                m.leader(leading);
            };
            let work_client = client.clone();
            let work_metrics = metrics.clone();
            lease::lead(elector, stop, on_change, move |work_stop| async move {
                controller::run(work_client, startup, &opts, work_metrics, work_stop).await;
            })
            .await
            .context("leader election")?;
        }
        server.abort();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_have_environment_fallbacks() {
        use clap::CommandFactory;
        let cmd = Args::command();
        for arg in cmd.get_arguments().filter(|a| a.get_id() != "help" && a.get_id() != "version") {
            assert!(arg.get_env().is_some(), "--{} has no environment fallback", arg.get_id());
        }
    }

    #[test]
    fn defaults_of_the_enforcement_timeout_and_the_audit_retention() {
        // What docs/controller.md states: 60 s, 90 days, 100 per run; the same as the library's
        // defaults (Options::new, Retention::default), which tests start from.
        let args = Args::try_parse_from(["flock-controller"]).unwrap();
        assert_eq!((args.enforced_timeout_seconds, args.audit_max_age_days, args.audit_max_per_run), (60, 90, 100));
        assert_eq!(args.enforced_timeout(), Duration::from_secs(60));
        assert_eq!(args.retention(), Retention::default());
        let opts = Options::new(
            EnforceMode::Auto,
            ClusterConfig { pod_cidrs: Vec::new(), service_cidrs: Vec::new(), dns: DnsConfig::default(), api_server: Default::default() },
        );
        assert_eq!((opts.enforced_timeout, opts.retention), (args.enforced_timeout(), args.retention()));
        // Zero is raised to the least that works.
        let zero = Args::try_parse_from([
            "flock-controller",
            "--enforced-timeout-seconds",
            "0",
            "--audit-max-age-days",
            "0",
            "--audit-max-per-run",
            "0",
        ])
        .unwrap();
        assert_eq!(zero.enforced_timeout(), Duration::from_secs(1));
        assert_eq!((zero.retention().max_age, zero.retention().max_per_run), (Duration::from_secs(24 * 3600), 1));
    }

    #[test]
    fn enforce_takes_only_auto_on_off() {
        for ok in ["auto", "on", "off"] {
            assert!(Args::try_parse_from(["flock-controller", "--enforce", ok]).is_ok(), "{ok}");
        }
        for bad in ["yes", "true", "ON", "enforce"] {
            assert!(Args::try_parse_from(["flock-controller", "--enforce", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn dns_labels() {
        assert_eq!(parse_labels("k8s-app=kube-dns").unwrap().len(), 1);
        assert!(parse_labels("nope").is_err());
        assert!(parse_labels("").is_err());
        assert!(parse_labels("a=-x").is_err());
    }
}
