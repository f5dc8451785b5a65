//! Real-kernel test support: the root gate, throwaway network namespaces with RAII cleanup,
//! a sweep of leftovers from crashed runs, and routed "pods" wired the way flock-cni wires
//! them.
//!
//! Kernel tests call [`require_root`] first. With `FLOCK_REQUIRE_ROOT=1` (CI) a missing
//! capability fails the test; otherwise the test prints why it is skipped and passes.
//! Every namespace is named `flkt-<pid>-<tag>`; [`sweep`] removes those whose process is
//! gone, so a killed run leaves nothing behind for the next one.

use std::net::IpAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::netns::Netns;

/// Prefix of every namespace tests create.
pub const PREFIX: &str = "flkt-";

/// Whether kernel tests can run here. Panics (fails the test) when they cannot and
/// `FLOCK_REQUIRE_ROOT=1`; otherwise prints a skip notice and returns false.
#[allow(clippy::panic)]
pub fn require_root(test: &str) -> bool {
    let required = std::env::var("FLOCK_REQUIRE_ROOT").is_ok_and(|v| v == "1");
    let problem = capability_problem();
    match problem {
        None => {
            sweep();
            true
        }
        Some(why) if required => panic!("{test}: FLOCK_REQUIRE_ROOT=1 but kernel tests cannot run: {why}"),
        Some(why) => {
            eprintln!("SKIP {test}: needs root, ip and nft ({why}); set FLOCK_REQUIRE_ROOT=1 to make this a failure");
            false
        }
    }
}

fn capability_problem() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root".into());
    }
    for (tool, args) in [("ip", &["-V"][..]), ("nft", &["--version"][..])] {
        match Command::new(tool).args(args).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return Some(format!("{tool} failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => return Some(format!("{tool} not found ({e}); apt-get install -y iproute2 nftables")),
        }
    }
    None
}

/// Removes `flkt-<pid>-*` namespaces whose process no longer exists.
pub fn sweep() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace deleted on drop (links inside it go with it).
#[derive(Debug)]
pub struct NetnsGuard {
    pub name: String,
}

impl NetnsGuard {
    /// Creates `flkt-<pid>-<n>-<tag>` with `lo` up.
    #[allow(clippy::panic)]
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}-{tag}", std::process::id());
        run(&["ip", "netns", "add", &name]);
        let g = Self { name };
        g.ip(&["link", "set", "lo", "up"]);
        g
    }

    pub fn netns(&self) -> Netns {
        Netns::named(&self.name)
    }

    /// Runs a command inside the namespace; panics on failure.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Runs a command inside the namespace, returning its output whatever the status.
    pub fn try_exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        try_run(&full)
    }

    /// `ip -n <ns> ...`
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Sets a sysctl inside the namespace (namespaced sysctls only: the host is untouched).
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec(&["sysctl", "-q", "-w", &format!("{key}={value}")]);
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Runs a command; panics with its stderr when it fails.
#[allow(clippy::panic)]
pub fn run(args: &[&str]) -> Output {
    let out = try_run(args);
    if !out.status.success() {
        panic!("{} failed: {}{}", args.join(" "), String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    }
    out
}

/// Runs a command and returns its output.
#[allow(clippy::panic)]
pub fn try_run(args: &[&str]) -> Output {
    match Command::new(args[0]).args(&args[1..]).output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run {}: {e}", args[0]),
    }
}

/// A routed node: one namespace acting as the host, forwarding enabled.
pub struct Node {
    pub ns: NetnsGuard,
}

/// A pod wired into a [`Node`] like flock-cni wires it: a veth whose host side is `iface`
/// (no address, proxy ARP, a /32 or /128 route to the pod) and whose pod side is `eth0`
/// with the pod's addresses and a link-local default gateway.
pub struct Pod {
    pub ns: NetnsGuard,
    pub iface: String,
    pub ips: Vec<IpAddr>,
}

impl Node {
    pub fn new(tag: &str) -> Self {
        let ns = NetnsGuard::new(tag);
        // A default route over an uplink, as every real node has: proxy ARP answers for the
        // pods' link-local gateway only when the node has a route to it via another device.
        // (No dummy driver on every kernel: a veth pair whose peer stays in the node.)
        ns.ip(&["link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer"]);
        ns.ip(&["link", "set", "uplink-peer", "up"]);
        ns.ip(&["link", "set", "uplink", "up"]);
        ns.ip(&["route", "add", "default", "dev", "uplink"]);
        ns.sysctl("net.ipv4.ip_forward", "1");
        ns.sysctl("net.ipv6.conf.all.forwarding", "1");
        Self { ns }
    }

    /// Creates a pod namespace and wires it with host interface `iface`.
    pub fn add_pod(&self, tag: &str, iface: &str, ips: &[IpAddr]) -> Pod {
        let pod = NetnsGuard::new(tag);
        run(&["ip", "-n", &self.ns.name, "link", "add", iface, "type", "veth", "peer", "name", "eth0", "netns", &pod.name]);
        pod.sysctl("net.ipv6.conf.eth0.accept_dad", "0");
        self.ns.sysctl(&format!("net.ipv6.conf.{iface}.accept_dad"), "0");
        pod.ip(&["link", "set", "eth0", "up"]);
        self.ns.ip(&["link", "set", iface, "up"]);
        self.ns.sysctl(&format!("net.ipv4.conf.{iface}.proxy_arp"), "1");
        self.ns.sysctl(&format!("net.ipv4.neigh.{iface}.proxy_delay"), "0");
        let mut has_v6 = false;
        for ip in ips {
            match ip {
                IpAddr::V4(a) => {
                    pod.ip(&["addr", "add", &format!("{a}/32"), "dev", "eth0"]);
                    self.ns.ip(&["route", "add", &format!("{a}/32"), "dev", iface]);
                }
                IpAddr::V6(a) => {
                    has_v6 = true;
                    pod.ip(&["-6", "addr", "add", &format!("{a}/128"), "dev", "eth0", "nodad"]);
                    self.ns.ip(&["-6", "route", "add", &format!("{a}/128"), "dev", iface]);
                }
            }
        }
        if ips.iter().any(IpAddr::is_ipv4) {
            pod.ip(&["route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"]);
            pod.ip(&["route", "add", "default", "via", "169.254.1.1", "dev", "eth0"]);
        }
        if has_v6 {
            self.ns.ip(&["-6", "addr", "add", "fe80::1/64", "dev", iface, "nodad"]);
            pod.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]);
        }
        Pod { ns: pod, iface: iface.to_string(), ips: ips.to_vec() }
    }
}
