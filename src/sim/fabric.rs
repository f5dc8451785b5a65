//! The simulated cluster's plumbing: network namespaces for the fabric, nodes, pods and
//! hosts, and the links between them (a bridge in the fabric namespace, one veth per member),
//! made with iproute2. Every namespace is named `flks-<pid>-<n>-…` and recorded, so teardown
//! removes exactly what this run made, and a sweep removes what a crashed run left. A run
//! kept for inspection carries a marker in its work directory and is swept only on request.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::netns::Netns;

/// Prefix of every simulation namespace.
pub const PREFIX: &str = "flks-";
/// Where simulations keep sockets, leases and state (`<dir>/<pid>-<n>`).
pub(crate) const WORK_ROOT: &str = "/run/flock-sim";

/// A failed plumbing command.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {message}")]
pub struct PlumbingError {
    pub(crate) command: String,
    pub(crate) message: String,
}

/// Writes a sysctl inside network namespace `ns`.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), PlumbingError> {
    run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", &format!("{key}={value}")]).map(drop)
}

/// Runs nft `script` (from stdin) inside network namespace `ns`.
fn nft_in(ns: &str, script: &str) -> Result<(), PlumbingError> {
    use std::io::Write as _;
    let command = format!("ip netns exec {ns} nft -f -");
    let fail = |message: String| PlumbingError { command: command.clone(), message };
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run ip: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(|e| fail(format!("writing the script: {e}")))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if out.status.success() { Ok(()) } else { Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_string())) }
}

/// Runs a command, failing with its stderr.
pub fn run(args: &[&str]) -> Result<String, PlumbingError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| PlumbingError { command: args.join(" "), message: format!("cannot run {}: {e}", args[0]) })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(PlumbingError { command: args.join(" "), message: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Waits until `link` in namespace `ns` is operationally up (`operstate` UP), for at most
/// `timeout`.
///
/// A veth end that is already up when its peer comes up gets its carrier at once, but the
/// kernel activates its transmit queue only later, in its link-watch work (which needs the
/// RTNL lock, and is late when the machine is busy): until then every packet sent on it is
/// dropped (the `noop` queue), and its `operstate` turns UP in that same work. The host side
/// of a pod's veth is that end (flock-cni sets it up first): packets to a pod whose ADD just
/// returned may be lost, so nothing may be sent to the pod before this.
pub(crate) fn wait_link_up(ns: &str, link: &str, timeout: std::time::Duration) -> Result<(), PlumbingError> {
    let deadline = std::time::Instant::now() + timeout;
    let args = ["ip", "-n", ns, "-j", "link", "show", "dev", link];
    loop {
        let out = run(&args)?;
        let state = serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v[0]["operstate"].as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".into());
        if state == "UP" {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline || interrupted().is_some() {
            return Err(PlumbingError {
                command: args.join(" "),
                message: format!(
                    "{link} is not operationally up {:.1}s after it was set up (operstate {state}): the kernel has not activated it, \
                     packets sent on it are dropped",
                    timeout.as_secs_f64()
                ),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Namespaces and links of one simulation run.
pub(crate) struct Fabric {
    pub(crate) run_id: String,
    pub(crate) fabric_ns: String,
    created: Mutex<Vec<String>>,
    members: Mutex<usize>,
    /// A routed underlay: the fabric namespace routes between its members instead of
    /// bridging them (each member behind a port of its own, no member on-link with another).
    pub(crate) routed: bool,
    /// The fabric's port of each member namespace.
    ports: Mutex<BTreeMap<String, String>>,
    /// Routed and validating sources: the port each member address is reached through.
    sources: Option<Mutex<BTreeMap<IpAddr, String>>>,
}

/// The routed underlay's gateway, on every fabric port (link-local data, as pods' gateways).
pub(crate) const ROUTER_V4: &str = "169.254.0.1";
pub(crate) const ROUTER_V6: &str = "fe80::1";
/// The routed underlay's table of pod CIDRs, for hosts' packets.
const HOSTS_TABLE: &str = "100";
/// The routed underlay's source validation (in the fabric namespace, never the host's): what
/// arrives on a port is forwarded only from an address of that port's member (a node's, a
/// host's) or, from a node, from its pod CIDRs — as a cloud VPC checks sources.
const SOURCE_CHECK: &str = "table inet underlay {
  comment \"flockctl sim: the routed underlay forwards only what a member sends from its own addresses (a node's also from its pod CIDRs)\"
  set sources-v4 { type ifname . ipv4_addr; flags interval; comment \"fabric port . an address its member may send from\"; }
  set sources-v6 { type ifname . ipv6_addr; flags interval; comment \"fabric port . an address its member may send from\"; }
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname . ip saddr != @sources-v4 counter drop comment \"a source that is not the sending member's: spoofed\"
    iifname . ip6 saddr != @sources-v6 counter drop comment \"a source that is not the sending member's: spoofed\"
  }
}
";

impl Fabric {
    /// Creates the fabric namespace: a bridge `br0` (an L2 underlay) or a router (`routed`).
    /// Runs are named `flks-<pid>-<n>`, so one process can hold several.
    /// With `validate` (routed only), the router drops what a member sends from another's
    /// address ([`SOURCE_CHECK`]).
    pub(crate) fn new(routed: bool, validate: bool) -> Result<Self, PlumbingError> {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let run_id = format!("{PREFIX}{}-{n}", std::process::id());
        let f = Self {
            fabric_ns: format!("{run_id}-fabric"),
            run_id,
            created: Mutex::new(Vec::new()),
            members: Mutex::new(0),
            routed,
            ports: Mutex::new(BTreeMap::new()),
            sources: (routed && validate).then(|| Mutex::new(BTreeMap::new())),
        };
        f.add_netns(&f.fabric_ns)?;
        if routed {
            sysctl(&f.fabric_ns, "net.ipv4.ip_forward", "1")?;
            sysctl(&f.fabric_ns, "net.ipv6.conf.all.forwarding", "1")?;
            if f.sources.is_some() {
                nft_in(&f.fabric_ns, SOURCE_CHECK)?;
            }
        } else {
            run(&["ip", "-n", &f.fabric_ns, "link", "add", "br0", "type", "bridge"])?;
            run(&["ip", "-n", &f.fabric_ns, "link", "set", "br0", "up"])?;
        }
        Ok(f)
    }

    /// Routed underlay: `addr` of member `ns` reached through its port (the fabric's route).
    pub(crate) fn route_member(&self, ns: &str, addr: IpAddr) -> Result<(), PlumbingError> {
        if !self.routed {
            return Ok(());
        }
        let port = self.port(ns)?;
        let cidr = format!("{addr}/{}", if addr.is_ipv4() { 32 } else { 128 });
        let fam = if addr.is_ipv4() { "-4" } else { "-6" };
        run(&["ip", fam, "-n", &self.fabric_ns, "route", "replace", &cidr, "dev", &port])?;
        if let Some(sources) = &self.sources {
            if let Ok(mut s) = sources.lock() {
                s.insert(addr, port.clone());
            }
            self.allow_source(&port, &cidr, addr.is_ipv6())?;
        }
        Ok(())
    }

    /// Validating: member port `port` may send from `cidr`.
    fn allow_source(&self, port: &str, cidr: &str, v6: bool) -> Result<(), PlumbingError> {
        let set = if v6 { "sources-v6" } else { "sources-v4" };
        nft_in(&self.fabric_ns, &format!("add element inet underlay {set} {{ \"{port}\" . {cidr} }}\n"))
    }

    /// Routed underlay: `cidr` (a node's pods) via the member's address `via`, for what comes
    /// from hosts only ([`Fabric::admit_host`]): between nodes the router knows no pod, so
    /// host-gw cannot cross it.
    pub(crate) fn route_via_member(&self, cidr: &str, via: IpAddr) -> Result<(), PlumbingError> {
        let fam = if via.is_ipv4() { "-4" } else { "-6" };
        run(&["ip", fam, "-n", &self.fabric_ns, "route", "replace", cidr, "via", &via.to_string(), "table", HOSTS_TABLE])?;
        // The node's pods' packets to hosts come from its port with their own sources.
        if let Some(sources) = &self.sources {
            let port = sources.lock().ok().and_then(|s| s.get(&via).cloned());
            if let Some(port) = port {
                self.allow_source(&port, cidr, via.is_ipv6())?;
            }
        }
        Ok(())
    }

    /// Routed underlay: what host `ns` sends may reach pods ([`Fabric::route_via_member`]).
    pub(crate) fn admit_host(&self, ns: &str) -> Result<(), PlumbingError> {
        let port = self.port(ns)?;
        for fam in ["-4", "-6"] {
            run(&["ip", fam, "-n", &self.fabric_ns, "rule", "add", "iif", &port, "lookup", HOSTS_TABLE, "priority", "100"])?;
        }
        Ok(())
    }

    fn port(&self, ns: &str) -> Result<String, PlumbingError> {
        self.ports
            .lock()
            .ok()
            .and_then(|p| p.get(ns).cloned())
            .ok_or_else(|| PlumbingError { command: format!("port of {ns}"), message: "not attached".into() })
    }

    /// A member's default routes: on-link on the bridge, or via the router.
    pub(crate) fn default_routes(&self, ns: &str) -> Result<(), PlumbingError> {
        if self.routed {
            run(&["ip", "-4", "-n", ns, "route", "replace", "default", "via", ROUTER_V4, "dev", "eth0", "onlink"])?;
            run(&["ip", "-6", "-n", ns, "route", "replace", "default", "via", ROUTER_V6, "dev", "eth0"]).map(drop)
        } else {
            self.route(ns, "default", None)?;
            self.route(ns, "::/0", None)
        }
    }

    /// A namespace name of this run.
    pub(crate) fn ns_name(&self, kind: &str, index: usize) -> String {
        format!("{}-{kind}{index}", self.run_id)
    }

    /// Creates a namespace (recorded for teardown) with `lo` up; none after an interrupt.
    pub(crate) fn add_netns(&self, name: &str) -> Result<Netns, PlumbingError> {
        if let Some(signal) = interrupted() {
            return Err(PlumbingError { command: format!("ip netns add {name}"), message: format!("interrupted by signal {signal}") });
        }
        run(&["ip", "netns", "add", name])?;
        if let Ok(mut c) = self.created.lock() {
            c.push(name.to_string());
        }
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(Netns::named(name))
    }

    /// Deletes a namespace of this run (its links and routes go with it).
    pub(crate) fn del_netns(&self, name: &str) {
        let _ = run(&["ip", "netns", "del", name]);
        if let Ok(mut c) = self.created.lock() {
            c.retain(|n| n != name);
        }
    }

    /// Joins `ns` to the fabric: a veth whose fabric end is a bridge port and whose other end
    /// is `eth0` in `ns`, with `addrs` (host prefixes, no DAD).
    pub(crate) fn attach(&self, ns: &str, addrs: &[IpAddr]) -> Result<(), PlumbingError> {
        let port = {
            let mut m = self.members.lock().map_err(|_| PlumbingError { command: "attach".into(), message: "poisoned".into() })?;
            *m += 1;
            format!("m{}", *m)
        };
        run(&["ip", "-n", &self.fabric_ns, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        if self.routed {
            sysctl(&self.fabric_ns, &format!("net.ipv6.conf.{port}.accept_dad"), "0")?;
            run(&["ip", "-n", &self.fabric_ns, "addr", "add", &format!("{ROUTER_V4}/32"), "dev", &port])?;
            run(&["ip", "-n", &self.fabric_ns, "addr", "add", &format!("{ROUTER_V6}/64"), "dev", &port, "nodad"])?;
            run(&["ip", "-n", &self.fabric_ns, "link", "set", &port, "up"])?;
            if let Ok(mut p) = self.ports.lock() {
                p.insert(ns.to_string(), port.clone());
            }
        } else {
            run(&["ip", "-n", &self.fabric_ns, "link", "set", &port, "master", "br0", "up"])?;
        }
        run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.eth0.accept_dad=0"])?;
        for a in addrs {
            let cidr = format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
            if a.is_ipv4() {
                run(&["ip", "-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
            } else {
                run(&["ip", "-n", ns, "addr", "add", &cidr, "dev", "eth0", "nodad"])?;
            }
        }
        run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
        for a in addrs {
            self.route_member(ns, *a)?;
        }
        Ok(())
    }

    /// `ip route replace <dst> [via <via>] dev eth0` in `ns`.
    pub(crate) fn route(&self, ns: &str, dst: &str, via: Option<IpAddr>) -> Result<(), PlumbingError> {
        let v6 = dst.contains(':') || via.is_some_and(|v| v.is_ipv6());
        let fam = if v6 { "-6" } else { "-4" };
        let mut args = vec!["ip", fam, "-n", ns, "route", "replace", dst];
        let via_s = via.map(|v| v.to_string());
        if let Some(v) = &via_s {
            args.extend(["via", v.as_str()]);
        }
        args.extend(["dev", "eth0"]);
        run(&args).map(drop)
    }

    /// Writes a sysctl inside `ns`.
    pub(crate) fn sysctl(&self, ns: &str, key: &str, value: &str) -> Result<(), PlumbingError> {
        sysctl(ns, key, value)
    }

    /// The work directory of this run (`<WORK_ROOT>/<pid>-<n>`).
    pub(crate) fn work_dir(&self) -> PathBuf {
        PathBuf::from(WORK_ROOT).join(self.run_id.trim_start_matches(PREFIX))
    }

    /// Removes every namespace this run created (fabric last) and its work directory.
    pub(crate) fn teardown(&self) {
        let names: Vec<String> = self.created.lock().map(|c| c.clone()).unwrap_or_default();
        for n in names.iter().rev() {
            let _ = run(&["ip", "netns", "del", n]);
        }
        if let Ok(mut c) = self.created.lock() {
            c.clear();
        }
        let _ = std::fs::remove_dir_all(self.work_dir());
    }

    /// Marks this run as kept on purpose: the sweep every new simulation does leaves it,
    /// only `flockctl sim --cleanup` ([`Sweep::AlsoKept`]) or an interrupt of this process
    /// removes it. The marker lives in the work directory, so it goes with the run.
    pub(crate) fn mark_kept(&self) -> std::io::Result<()> {
        std::fs::write(self.work_dir().join(KEPT_MARKER), format!("namespaces {}\n", self.namespaces().join(" ")))
    }

    /// Names of the namespaces still present.
    pub(crate) fn namespaces(&self) -> Vec<String> {
        self.created.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// The signal that interrupted this process's simulations (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// Stops this process's simulations on `signal`: no namespace is created from now on, the
/// existing ones are removed (so probes, syncs and waits fail fast) and in-flight child
/// processes (CNI plugins, ip, nft) are killed. The caller lets the simulation unwind, then
/// calls [`sweep_own`] for what was written meanwhile.
pub fn interrupt(signal: i32) {
    INTERRUPTED.store(signal, Ordering::SeqCst);
    sweep_own();
    kill_children();
}

/// The signal passed to [`interrupt`], if any.
pub fn interrupted() -> Option<i32> {
    Some(INTERRUPTED.load(Ordering::SeqCst)).filter(|s| *s != 0)
}

/// SIGKILLs this process's child processes (of every thread; `/proc/self/task/*/children`).
pub fn kill_children() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
    for t in tasks.filter_map(|e| e.ok()) {
        let Ok(children) = std::fs::read_to_string(t.path().join("children")) else { continue };
        for pid in children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Removes every namespace and work directory of this process (after an interrupt).
pub fn sweep_own() -> usize {
    let me = format!("{PREFIX}{}-", std::process::id());
    let mut removed = 0;
    if let Ok(list) = run(&["ip", "netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(&me)) {
            let _ = run(&["ip", "netns", "del", name]);
            removed += 1;
        }
    }
    if let Ok(dirs) = std::fs::read_dir(WORK_ROOT) {
        for d in dirs.filter_map(|e| e.ok()) {
            if d.file_name().to_string_lossy().starts_with(&format!("{}-", std::process::id())) {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }
    removed
}

/// What a sweep removes besides crashed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Runs whose process is gone, except kept ones (what every new simulation does first).
    Crashed,
    /// Also kept runs (`flockctl sim --cleanup`).
    AlsoKept,
}

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Namespaces removed.
    pub removed: usize,
    /// Kept runs left in place (`<pid>-<n>`), with their namespace count.
    pub(crate) kept: Vec<(String, usize)>,
}

/// Removes namespaces and work directories of earlier runs whose process is gone; kept runs
/// (marked by [`Fabric::mark_kept`]) only with [`Sweep::AlsoKept`]. A simulation that is
/// still running is never touched: its names carry its pid.
pub fn sweep(mode: Sweep) -> Swept {
    let alive = |pid: i32| pid == std::process::id() as i32 || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    // `<pid>-<n>` of a namespace (`flks-<pid>-<n>-…`) or work directory (`<pid>-<n>`).
    let run_of = |name: &str| -> Option<(i32, String)> {
        let mut parts = name.splitn(3, '-');
        let pid = parts.next()?.parse::<i32>().ok()?;
        let n = parts.next()?.parse::<usize>().ok()?;
        Some((pid, format!("{pid}-{n}")))
    };
    let removable = |run: &str, pid: i32| !alive(pid) && (mode == Sweep::AlsoKept || !is_kept(run));
    let mut swept = Swept::default();
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    if let Ok(list) = run(&["ip", "netns", "list"]) {
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some((pid, run_id)) = name.strip_prefix(PREFIX).and_then(run_of) else { continue };
            if removable(&run_id, pid) {
                let _ = run(&["ip", "netns", "del", name]);
                swept.removed += 1;
            } else if !alive(pid) {
                *kept.entry(run_id).or_default() += 1;
            }
        }
    }
    if let Ok(dirs) = std::fs::read_dir(WORK_ROOT) {
        for d in dirs.filter_map(|e| e.ok()) {
            let name = d.file_name().to_string_lossy().to_string();
            if let Some((pid, run_id)) = run_of(&name)
                && removable(&run_id, pid)
            {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }
    swept.kept = kept.into_iter().collect();
    swept
}

/// The marker file of a kept run, in its work directory.
const KEPT_MARKER: &str = "kept";

/// Whether run `<pid>-<n>` was kept on purpose.
fn is_kept(run_id: &str) -> bool {
    PathBuf::from(WORK_ROOT).join(run_id).join(KEPT_MARKER).is_file()
}
