//! The verbs: ADD, DEL, CHECK, STATUS, GC, VERSION.
//!
//! ADD: IPAM → veth, addresses, routes → agent call → result. The agent acknowledges only
//! once the pod's rules are committed; until then the node's ruleset drops the pod's unknown
//! interface, so no packet passes before policy. If the agent is unreachable, refuses or
//! does not answer in time, ADD removes the veth, releases the IPAM lease and fails with
//! code 11 (the runtime retries). When the request may have reached the agent (it refused,
//! timed out or broke the connection), ADD first withdraws the endpoint with a DEL — to the
//! agent, or the spool when the agent cannot be reached — so no half-made endpoint stays
//! registered. `CNI_NETNS` naming the plugin's own network namespace is refused (code 4).
//!
//! DEL is best-effort and idempotent: delete the host interface (its peer, routes and
//! addresses go with it), tell the agent — or, when it is down, spool the notification for
//! the agent to drain at start — then IPAM DEL. A repeated DEL, a vanished netns, an empty
//! `CNI_NETNS` and a missing `prevResult` all succeed.
//!
//! Everywhere, an IPAM lease is released only after the agent has dropped the endpoint or
//! the DEL waits in the spool: an address handed to the next pod while the agent still maps
//! it to the old one would carry the old pod's identity.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::dataplane::{self, DataplaneError, GATEWAY_V4, GATEWAY_V6, PodNetwork};
use crate::env::{Env, Verb};
use crate::protocol::{self, AddRequest, AgentError, CheckRequest, DelRequest, GcRequest, PodIdentity, Request};
use crate::spec::{self, CniError, CniResult, Interface, IpConfig, NetConf, Route, Version, code, ipnet_lite::Cidr};
use crate::{host_interface_name, ipam, netns, state};

/// Default wait for the agent's ADD acknowledgement (kubelet's runtime timeout is 2 min).
pub const DEFAULT_ADD_TIMEOUT: Duration = Duration::from_secs(30);
const DEL_TIMEOUT: Duration = Duration::from_secs(10);
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
const GC_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one invocation. `Ok(Some(json))` is printed on stdout; `Ok(None)` prints nothing.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    if env.verb == Verb::Version {
        return Ok(Some(version(stdin)));
    }
    let (conf, version) = spec::parse_conf(stdin)?;
    crate::log::init(&conf);
    tracing::debug!(verb = env.verb.as_str(), container = %env.container_id, ifname = %env.ifname, "flock-cni invoked");
    let ctx = Ctx { env, stdin, conf: &conf, version };
    match env.verb {
        Verb::Add => ctx.add().map(Some),
        Verb::Del => ctx.del().map(|()| None),
        Verb::Check => ctx.check().map(|()| None),
        Verb::Status => ctx.status().map(|()| None),
        Verb::Gc => ctx.gc().map(|()| None),
        Verb::Version => Ok(Some(self::version(stdin))),
    }
}

/// VERSION's answer: the input's `cniVersion` (if any) and every supported version.
pub fn version(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| spec::LATEST.to_string());
    json!({"cniVersion": asked, "supportedVersions": spec::SUPPORTED_VERSIONS})
}

struct Ctx<'a> {
    env: &'a Env,
    stdin: &'a [u8],
    conf: &'a NetConf,
    version: Version,
}

impl Ctx<'_> {
    fn socket(&self) -> PathBuf {
        self.conf.agent_socket.clone().unwrap_or_else(|| PathBuf::from(protocol::DEFAULT_SOCKET))
    }

    fn spool_dir(&self) -> PathBuf {
        self.conf.pending_del_dir.clone().unwrap_or_else(|| PathBuf::from(protocol::DEFAULT_PENDING_DEL_DIR))
    }

    fn state_dir(&self) -> PathBuf {
        state::network_dir(&self.conf.state_dir.clone().unwrap_or_else(|| PathBuf::from(state::DEFAULT_STATE_DIR)), &self.conf.name)
    }

    fn host_if(&self) -> String {
        host_interface_name(&self.env.container_id, &self.env.ifname)
    }

    fn ipam(&self) -> Result<Option<PathBuf>, CniError> {
        match self.conf.ipam_type()? {
            None => Ok(None),
            Some(t) => ipam::find(&t, &self.env.path).map(Some),
        }
    }

    fn netns(&self) -> Result<PathBuf, CniError> {
        let p = self
            .env
            .netns
            .clone()
            .ok_or_else(|| CniError::new(code::INVALID_ENV, "required environment variables missing").with_details("CNI_NETNS"))?;
        if !dataplane::netns_exists(&p) {
            return Err(CniError::new(code::INVALID_ENV, format!("CNI_NETNS {} cannot be opened", p.display())).with_details("CNI_NETNS"));
        }
        // Setting up the host's own namespace as a pod's would move its routes and
        // addresses around; compared by identity, as any path may name it.
        match netns::is_current(&p) {
            Ok(false) => Ok(p),
            Ok(true) => Err(CniError::new(
                code::INVALID_ENV,
                format!("CNI_NETNS {} is flock-cni's own network namespace, not a pod's", p.display()),
            )
            .with_details("CNI_NETNS")),
            Err(e) => Err(CniError::new(code::INVALID_ENV, e.to_string()).with_details("CNI_NETNS")),
        }
    }

    fn pod(&self) -> Result<PodIdentity, CniError> {
        match (&self.env.args.pod_namespace, &self.env.args.pod_name) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => {
                Ok(PodIdentity { namespace: ns.clone(), name: name.clone(), uid: self.env.args.pod_uid.clone().filter(|u| !u.is_empty()) })
            }
            _ => Err(CniError::new(
                code::INVALID_ENV,
                "CNI_ARGS must name the pod (K8S_POD_NAMESPACE and K8S_POD_NAME): flock enforces per-pod policy",
            )
            .with_details("CNI_ARGS")),
        }
    }

    fn add(&self) -> Result<Value, CniError> {
        if self.conf.agent_removed.is_some() {
            // No agent will program the pod: fail before anything is made.
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                "flock was removed from this node (its agent's DaemonSet was deleted): pods here need another CNI network",
            )
            .with_details("the config stays only until the node's last flock pod is deleted"));
        }
        let netns = self.netns()?;
        let pod = self.pod()?;
        let ipam_plugin =
            self.ipam()?.ok_or_else(|| CniError::new(code::INVALID_CONFIG, "ipam: required (e.g. {\"type\": \"host-local\", ...})"))?;
        let prev = match &self.conf.prev_result {
            Some(v) => Some(CniResult::parse(v).map_err(|e| CniError::new(code::INVALID_CONFIG, format!("prevResult: {e}")))?),
            None => None,
        };
        let host_if = self.host_if();
        // Before IPAM: a second ADD of the same attachment must not touch the live one's
        // lease (a rollback would release it).
        if dataplane::link_exists(&host_if).map_err(setup_error)? {
            return Err(CniError::new(
                code::INTERFACE_EXISTS,
                format!("interface {host_if} already exists (attachment {} / {} was added before)", self.env.container_id, self.env.ifname),
            ));
        }

        let ipam_out = ipam::exec(&ipam_plugin, "ADD", self.stdin, &[])?
            .ok_or_else(|| CniError::new(code::DELEGATE_FAILED, "the ipam plugin printed no result"))?;
        let release = || {
            if let Err(e) = ipam::exec(&ipam_plugin, "DEL", self.stdin, &[]) {
                tracing::error!(error = %e, "releasing the IPAM lease after a failed ADD");
            }
        };
        let leased = match CniResult::parse(&ipam_out).and_then(|r| addresses_of(&r).map(|a| (r, a))) {
            Ok(x) => x,
            Err(e) => {
                release();
                return Err(CniError::new(code::DELEGATE_FAILED, format!("the ipam plugin's result: {e}")));
            }
        };
        let (ipam_result, addrs) = leased;
        let pn = PodNetwork {
            host_if: host_if.clone(),
            pod_if: self.env.ifname.clone(),
            netns: netns.clone(),
            addrs: addrs.clone(),
            routes: ipam_result.routes.iter().map(|r| (r.dst.addr, r.dst.prefix)).collect(),
            mtu: self.conf.mtu,
        };
        let wired = match dataplane::setup(&pn) {
            Ok(w) => w,
            Err(e) => {
                release();
                return Err(setup_error(e));
            }
        };
        // `release_lease` is false only while the agent may still hold the endpoint: the
        // lease and the record then stay for the runtime's DEL (after a failed ADD) or GC.
        let undo = |why: &str, release_lease: bool| {
            tracing::warn!(%host_if, why, release_lease, "rolling back ADD");
            if let Err(e) = dataplane::teardown(&host_if) {
                tracing::error!(error = %e, %host_if, "removing the interface during rollback");
            }
            if release_lease {
                let _ = state::remove(&self.state_dir(), &self.env.container_id, &self.env.ifname);
                release();
            }
        };
        let record = state::Record {
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
            host_interface: host_if.clone(),
            netns: netns.display().to_string(),
            ips: addrs.clone(),
            pod: Some(pod.clone()),
        };
        if let Err(e) = state::write(&self.state_dir(), &record) {
            undo("cannot write the attachment record", true);
            return Err(CniError::new(code::STATE, format!("cannot write the attachment record in {}", self.state_dir().display()))
                .with_details(e.to_string()));
        }

        let timeout = self.conf.agent_timeout_seconds.map_or(DEFAULT_ADD_TIMEOUT, Duration::from_secs);
        let request = Request::Add(AddRequest {
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
            netns: netns.display().to_string(),
            host_interface: host_if.clone(),
            pod: pod.clone(),
            ips: addrs.clone(),
        });
        if let Err(e) = protocol::call_waiting(&self.socket(), request, timeout) {
            let failed = CniError::new(code::TRY_AGAIN_LATER, format!("flock-agent did not program pod {}/{}", pod.namespace, pod.name));
            // A late or failed sync leaves the endpoint registered in the agent (or about to
            // be): withdraw it before the lease can go to another pod.
            let withdrawn = if e.may_have_reached_agent() { self.notify_del(self.del_request(Some(pod.clone()))) } else { Ok(()) };
            return Err(match withdrawn {
                Ok(()) => {
                    undo("the agent did not acknowledge", true);
                    failed.with_details(e.to_string())
                }
                Err(de) => {
                    undo("the agent did not acknowledge, and neither it nor the spool took the DEL", false);
                    failed.with_details(format!("{e}; {de}"))
                }
            });
        }
        tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), %host_if, ips = ?addrs, "pod attached");
        Ok(self.result(prev, &pn, &wired, &ipam_result).to_json(self.version))
    }

    fn result(&self, prev: Option<CniResult>, pn: &PodNetwork, wired: &dataplane::Wired, ipam: &CniResult) -> CniResult {
        let mut r = prev.unwrap_or_default();
        let base = r.interfaces.len();
        r.interfaces.push(Interface { name: pn.host_if.clone(), mac: wired.host_mac.clone(), mtu: pn.mtu, sandbox: None });
        r.interfaces.push(Interface {
            name: pn.pod_if.clone(),
            mac: wired.pod_mac.clone(),
            mtu: pn.mtu,
            sandbox: Some(pn.netns.display().to_string()),
        });
        for a in &pn.addrs {
            let gateway = if a.is_ipv4() { IpAddr::V4(GATEWAY_V4) } else { IpAddr::V6(GATEWAY_V6) };
            r.ips.push(IpConfig { address: Cidr::host(*a), gateway: Some(gateway), interface: Some(base + 1) });
        }
        for (dst, prefix, gw) in dataplane::pod_routes(pn) {
            r.routes.push(Route { dst: Cidr { addr: dst, prefix }, gw: Some(gw) });
        }
        let ipam_dns = ipam.dns.as_object().is_some_and(|o| !o.is_empty());
        r.dns = if ipam_dns { ipam.dns.clone() } else { self.conf.dns.clone().unwrap_or(Value::Null) };
        r
    }

    /// The DEL notification of this attachment.
    fn del_request(&self, pod: Option<PodIdentity>) -> DelRequest {
        DelRequest { container_id: self.env.container_id.clone(), ifname: self.env.ifname.clone(), host_interface: self.host_if(), pod }
    }

    fn del(&self) -> Result<(), CniError> {
        let host_if = self.host_if();
        let ipam_plugin = self.ipam()?;
        let removed = dataplane::teardown(&host_if).map_err(setup_error)?;
        self.notify_del(self.del_request(self.pod().ok()))?;
        if let Some(plugin) = ipam_plugin {
            ipam::exec(&plugin, "DEL", self.stdin, &[])?;
        }
        state::remove(&self.state_dir(), &self.env.container_id, &self.env.ifname)
            .map_err(|e| CniError::new(code::STATE, "cannot remove the attachment record").with_details(e.to_string()))?;
        tracing::info!(%host_if, interface_removed = removed, "pod detached");
        if let Some(mark) = &self.conf.agent_removed {
            self.finish_removal(mark);
        }
        Ok(())
    }

    /// flock was removed from the node: once this DEL detached its last flock pod, removes
    /// the config, the plugin and the state left behind. Best-effort: the DEL itself is done,
    /// and a later DEL (or the operator) can finish.
    fn finish_removal(&self, mark: &crate::removal::Removed) {
        let paths = crate::removal::Paths { records: self.state_dir(), spool: self.spool_dir(), socket: self.socket() };
        match crate::removal::finish(self.conf, mark, &paths) {
            Ok(crate::removal::Finished::PodsLeft(n)) => {
                tracing::info!(pods = n, "flock was removed; its config stays for the node's other flock pods")
            }
            Ok(crate::removal::Finished::Removed(gone)) => {
                tracing::info!(removed = ?gone, "the node's last flock pod is gone: flock's config and plugin removed")
            }
            Err(e) => tracing::error!(error = %e, "flock was removed, and what it left cannot all be removed"),
        }
    }

    /// Tells the agent about a DEL, or spools it when the agent cannot take it now.
    fn notify_del(&self, del: DelRequest) -> Result<(), CniError> {
        match protocol::call(&self.socket(), Request::Del(del.clone()), DEL_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(e) if self.conf.agent_removed.is_some() => {
                // A reinstalled agent would drain the spool; a full one must not fail the DEL
                // of a node no agent serves.
                match protocol::spool_del(&self.spool_dir(), &del) {
                    Ok(path) => tracing::info!(error = %e, spool = %path.display(), "flock was removed; DEL queued should it come back"),
                    Err(se) => tracing::warn!(error = %e, spool_error = %se, "flock was removed; DEL not queued"),
                }
                Ok(())
            }
            Err(e) => {
                let path = protocol::spool_del(&self.spool_dir(), &del).map_err(|se| {
                    CniError::new(
                        code::STATE,
                        format!("flock-agent is unavailable and the DEL cannot be queued in {}", self.spool_dir().display()),
                    )
                    .with_details(format!("{e}; {se}"))
                })?;
                tracing::warn!(error = %e, spool = %path.display(), "flock-agent unavailable; DEL queued for it");
                Ok(())
            }
        }
    }

    fn check(&self) -> Result<(), CniError> {
        if self.version < Version::V0_4_0 {
            return Err(CniError::new(code::INCOMPATIBLE_VERSION, format!("CHECK is not defined for spec {}", self.version)));
        }
        let netns = self.netns()?;
        let prev = self.conf.prev_result.as_ref().ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK needs prevResult"))?;
        let prev = CniResult::parse(prev).map_err(|e| CniError::new(code::INVALID_CONFIG, format!("prevResult: {e}")))?;
        let host_if = self.host_if();
        let request = Request::Check(CheckRequest {
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
            host_interface: host_if.clone(),
        });
        match protocol::call(&self.socket(), request, CHECK_TIMEOUT) {
            Ok(()) => {}
            Err(e @ AgentError::Refused { .. }) => {
                return Err(CniError::new(code::CHECK_FAILED, "flock-agent has not programmed this pod").with_details(e.to_string()));
            }
            Err(e) => return Err(CniError::new(code::TRY_AGAIN_LATER, "flock-agent is unavailable").with_details(e.to_string())),
        }
        // The addresses this attachment got: those on our sandbox interface.
        let ours: Vec<IpAddr> = prev
            .ips
            .iter()
            .filter(|ip| {
                ip.interface.and_then(|i| prev.interfaces.get(i)).is_none_or(|itf| itf.name == self.env.ifname && itf.sandbox.is_some())
            })
            .map(|ip| ip.address.addr)
            .collect();
        let pn = PodNetwork { host_if, pod_if: self.env.ifname.clone(), netns, addrs: ours, routes: vec![], mtu: None };
        dataplane::check(&pn).map_err(|e| CniError::new(code::CHECK_FAILED, e))?;
        if let Some(plugin) = self.ipam()? {
            ipam::exec(&plugin, "CHECK", self.stdin, &[])?;
        }
        Ok(())
    }

    fn status(&self) -> Result<(), CniError> {
        protocol::call(&self.socket(), Request::Status, STATUS_TIMEOUT)
            .map_err(|e| CniError::new(code::NOT_AVAILABLE, "flock-agent is not ready to program pods").with_details(e.to_string()))?;
        if let Some(plugin) = self.ipam()?
            && ipam::supports(&plugin, spec::LATEST)
        {
            ipam::exec(&plugin, "STATUS", self.stdin, &[])?;
        }
        Ok(())
    }

    fn gc(&self) -> Result<(), CniError> {
        let valid = self
            .conf
            .gc_valid()
            .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "GC needs cni.dev/valid-attachments (or cni.dev/attachments)"))?;
        let valid_names: std::collections::BTreeSet<String> =
            valid.iter().map(|a| host_interface_name(&a.container_id, &a.ifname)).collect();
        let ipam_plugin = self.ipam()?;
        let mut errors = Vec::new();

        // Attachments this network recorded that the runtime no longer lists.
        let records = state::list(&self.state_dir())
            .map_err(|e| CniError::new(code::IO, "cannot read attachment records").with_details(e.to_string()))?;
        // Each step that fails keeps the record, so the next GC retries the rest.
        for r in records.iter().filter(|r| !valid.iter().any(|v| v.container_id == r.container_id && v.ifname == r.ifname)) {
            if let Err(e) = dataplane::teardown(&r.host_interface) {
                errors.push(format!("removing {}: {e}", r.host_interface));
                continue;
            }
            let del = DelRequest {
                container_id: r.container_id.clone(),
                ifname: r.ifname.clone(),
                host_interface: r.host_interface.clone(),
                pod: r.pod.clone(),
            };
            if let Err(e) = self.notify_del(del) {
                errors.push(e.to_string());
                continue;
            }
            if let Some(p) = &ipam_plugin
                && let Err(e) =
                    ipam::exec(p, "DEL", self.stdin, &[("CNI_CONTAINERID", &r.container_id), ("CNI_IFNAME", &r.ifname), ("CNI_NETNS", "")])
            {
                errors.push(format!("releasing the lease of {}/{}: {e}", r.container_id, r.ifname));
                continue;
            }
            if let Err(e) = state::remove(&self.state_dir(), &r.container_id, &r.ifname) {
                errors.push(format!("removing the record of {}/{}: {e}", r.container_id, r.ifname));
            }
            tracing::info!(container = %r.container_id, ifname = %r.ifname, "stale attachment collected");
        }

        // flock interfaces no record explains (an ADD that crashed half-way) and no valid
        // attachment owns.
        let root = self.conf.state_dir.clone().unwrap_or_else(|| PathBuf::from(state::DEFAULT_STATE_DIR));
        let recorded = state::all_host_interfaces(&root);
        match dataplane::links_with_prefix(crate::HOST_INTERFACE_PREFIX) {
            Ok(links) => {
                for l in links.into_iter().filter(|l| crate::is_host_interface_name(l) && !valid_names.contains(l) && !recorded.contains(l))
                {
                    match dataplane::teardown(&l) {
                        Ok(_) => tracing::info!(interface = %l, "stale interface removed"),
                        Err(e) => errors.push(format!("removing {l}: {e}")),
                    }
                }
            }
            Err(e) => errors.push(format!("listing interfaces: {e}")),
        }

        if let Err(e) = protocol::call(&self.socket(), Request::Gc(GcRequest { valid: valid.clone() }), GC_TIMEOUT) {
            tracing::warn!(error = %e, "flock-agent did not take GC; it reconciles its endpoints at start");
        }
        if let Some(p) = &ipam_plugin
            && ipam::supports(p, spec::LATEST)
            && let Err(e) = ipam::exec(p, "GC", self.stdin, &[])
        {
            errors.push(e.to_string());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(code::IO, format!("GC left {} problem(s)", errors.len())).with_details(errors.join("; ")))
        }
    }
}

/// The pod's addresses from an IPAM result: at least one, at most one per family.
fn addresses_of(r: &CniResult) -> Result<Vec<IpAddr>, String> {
    let addrs: Vec<IpAddr> = r.ips.iter().map(|i| i.address.addr).collect();
    if addrs.is_empty() {
        return Err("no address".into());
    }
    if addrs.iter().filter(|a| a.is_ipv4()).count() > 1 || addrs.iter().filter(|a| a.is_ipv6()).count() > 1 {
        return Err(format!("more than one address per family: {addrs:?}"));
    }
    Ok(addrs)
}

fn setup_error(e: DataplaneError) -> CniError {
    match &e {
        DataplaneError::Exists { .. } => CniError::new(code::INTERFACE_EXISTS, e.to_string()),
        DataplaneError::Netns(n) => CniError::new(code::INVALID_ENV, n.to_string()).with_details("CNI_NETNS"),
        _ => CniError::new(code::NETWORK_SETUP, e.to_string()),
    }
}

/// Most bytes of stdin flock-cni reads. A network configuration is a few kilobytes: one
/// plugin's settings plus what the runtime adds (`runtimeConfig`, a `prevResult` of a few
/// interfaces and addresses, and for GC the valid attachments, ~100 bytes each, so about
/// 10,000 of them would fit, far more pods than a node runs). The bound keeps a runaway or
/// hostile writer from making the plugin buffer stdin without limit (a 50 MB stdin used to
/// be read whole).
pub const MAX_STDIN: usize = 1 << 20;

/// Reads the network configuration from `input`, at most [`MAX_STDIN`] bytes: a larger one
/// is refused with code 5 (an I/O failure reading stdin) without being read on. A read error
/// is treated like empty input (VERSION may come with nothing on stdin; the verbs that need
/// a configuration report a decode error).
pub fn read_stdin(input: impl std::io::Read) -> Result<Vec<u8>, CniError> {
    use std::io::Read;
    let mut buf = Vec::new();
    // One byte past the limit tells a configuration of exactly the limit from a larger one.
    if input.take(MAX_STDIN as u64 + 1).read_to_end(&mut buf).is_err() {
        buf.clear();
    }
    if buf.len() > MAX_STDIN {
        return Err(CniError::new(code::IO, format!("the network configuration on stdin is larger than {MAX_STDIN} bytes"))
            .with_details(format!("flock-cni reads at most {MAX_STDIN} bytes of stdin; a network configuration is a few kilobytes")));
    }
    Ok(buf)
}

/// The exit path of the binary: the JSON for stdout and the exit status.
pub fn outcome(env: Result<Env, CniError>, stdin: &[u8]) -> (Option<Value>, bool) {
    let version = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string))
        .filter(|v| Version::parse(v).is_some())
        .unwrap_or_else(|| spec::LATEST.to_string());
    let result = env.and_then(|env| match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&env, stdin))) {
        Ok(r) => r,
        Err(p) => {
            let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            Err(CniError::new(code::INTERNAL, "flock-cni failed unexpectedly (a bug)").with_details(why))
        }
    });
    match result {
        Ok(out) => (out, true),
        Err(e) => {
            crate::log::ensure();
            tracing::error!(code = e.code, msg = %e.msg, details = %e.details, "CNI error");
            (Some(e.to_json(&version)), false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A reader of `len` bytes that counts what was read from it.
    struct Counted<R> {
        inner: R,
        read: usize,
    }

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }

    #[test]
    fn an_oversized_stdin_is_refused_without_reading_it_all() {
        let mut big = Counted { inner: std::io::repeat(b' ').take(50 << 20), read: 0 };
        let e = read_stdin(&mut big).unwrap_err();
        assert_eq!(e.code, code::IO);
        assert!(e.msg.contains("larger than 1048576 bytes"), "{e:?}");
        assert_eq!(big.read, MAX_STDIN + 1, "reading stops just past the limit");
        // The binary prints it as a CNI error object and fails.
        let (out, ok) = outcome(Err(e), &[]);
        let out = out.unwrap();
        assert!(!ok);
        assert_eq!((out["code"].as_u64(), out["cniVersion"].as_str()), (Some(u64::from(code::IO)), Some(spec::LATEST)));
        assert!(out["msg"].as_str().unwrap().contains("stdin"), "{out}");
    }

    #[test]
    fn stdin_up_to_the_limit_is_read_whole() {
        let exact = vec![b' '; MAX_STDIN];
        assert_eq!(read_stdin(exact.as_slice()).unwrap(), exact);
        let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"flock-cni"}"#;
        assert_eq!(read_stdin(&conf[..]).unwrap(), conf);
        assert!(read_stdin(std::io::empty()).unwrap().is_empty());
    }

    #[test]
    fn a_stdin_read_error_reads_as_empty() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("broken"))
            }
        }
        assert!(read_stdin(Broken).unwrap().is_empty());
    }
}
