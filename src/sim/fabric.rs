//! The simulated cluster's plumbing: network namespaces for the fabric, nodes, pods and
//! hosts, and the links between them (a bridge in the fabric namespace, one veth per member),
//! made with iproute2. Every namespace is named `flks-<pid>-…` and recorded, so teardown
//! removes exactly what this run made, and a sweep removes what a crashed run left.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::netns::Netns;

/// Prefix of every simulation namespace.
pub const PREFIX: &str = "flks-";
/// Where simulations keep sockets, leases and state (`<dir>/<pid>-<n>`).
pub const WORK_ROOT: &str = "/run/flock-sim";

/// A failed plumbing command.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {message}")]
pub struct PlumbingError {
    pub command: String,
    pub message: String,
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

/// Namespaces and links of one simulation run.
pub struct Fabric {
    pub run_id: String,
    pub fabric_ns: String,
    created: Mutex<Vec<String>>,
    members: Mutex<usize>,
}

impl Fabric {
    /// Creates the fabric namespace with bridge `br0`. Runs are named
    /// `flks-<pid>-<n>`, so one process can hold several.
    pub fn new() -> Result<Self, PlumbingError> {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let run_id = format!("{PREFIX}{}-{n}", std::process::id());
        let f = Self { fabric_ns: format!("{run_id}-fabric"), run_id, created: Mutex::new(Vec::new()), members: Mutex::new(0) };
        f.add_netns(&f.fabric_ns)?;
        run(&["ip", "-n", &f.fabric_ns, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &f.fabric_ns, "link", "set", "br0", "up"])?;
        Ok(f)
    }

    /// A namespace name of this run.
    pub fn ns_name(&self, kind: &str, index: usize) -> String {
        format!("{}-{kind}{index}", self.run_id)
    }

    /// Creates a namespace (recorded for teardown) with `lo` up.
    pub fn add_netns(&self, name: &str) -> Result<Netns, PlumbingError> {
        run(&["ip", "netns", "add", name])?;
        if let Ok(mut c) = self.created.lock() {
            c.push(name.to_string());
        }
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(Netns::named(name))
    }

    /// Deletes a namespace of this run (its links and routes go with it).
    pub fn del_netns(&self, name: &str) {
        let _ = run(&["ip", "netns", "del", name]);
        if let Ok(mut c) = self.created.lock() {
            c.retain(|n| n != name);
        }
    }

    /// Joins `ns` to the fabric: a veth whose fabric end is a bridge port and whose other end
    /// is `eth0` in `ns`, with `addrs` (host prefixes, no DAD).
    pub fn attach(&self, ns: &str, addrs: &[IpAddr]) -> Result<(), PlumbingError> {
        let port = {
            let mut m = self.members.lock().map_err(|_| PlumbingError { command: "attach".into(), message: "poisoned".into() })?;
            *m += 1;
            format!("m{}", *m)
        };
        run(&["ip", "-n", &self.fabric_ns, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        run(&["ip", "-n", &self.fabric_ns, "link", "set", &port, "master", "br0", "up"])?;
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
        Ok(())
    }

    /// `ip route replace <dst> [via <via>] dev eth0` in `ns`.
    pub fn route(&self, ns: &str, dst: &str, via: Option<IpAddr>) -> Result<(), PlumbingError> {
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
    pub fn sysctl(&self, ns: &str, key: &str, value: &str) -> Result<(), PlumbingError> {
        run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", &format!("{key}={value}")]).map(drop)
    }

    /// The work directory of this run (`<WORK_ROOT>/<pid>-<n>`).
    pub fn work_dir(&self) -> PathBuf {
        PathBuf::from(WORK_ROOT).join(self.run_id.trim_start_matches(PREFIX))
    }

    /// Removes every namespace this run created (fabric last) and its work directory.
    pub fn teardown(&self) {
        let names: Vec<String> = self.created.lock().map(|c| c.clone()).unwrap_or_default();
        for n in names.iter().rev() {
            let _ = run(&["ip", "netns", "del", n]);
        }
        if let Ok(mut c) = self.created.lock() {
            c.clear();
        }
        let _ = std::fs::remove_dir_all(self.work_dir());
    }

    /// Names of the namespaces still present.
    pub fn namespaces(&self) -> Vec<String> {
        self.created.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// Removes every namespace and work directory of this process (for an interrupted run that
/// cannot unwind).
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

/// Removes namespaces and work directories of earlier runs whose process is gone. A
/// simulation that is still running is never touched: its names carry its pid. Returns how
/// many namespaces were removed.
pub fn sweep() -> usize {
    let alive = |pid: i32| pid == std::process::id() as i32 || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    let mut removed = 0;
    if let Ok(list) = run(&["ip", "netns", "list"]) {
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some(rest) = name.strip_prefix(PREFIX) else { continue };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
            if !alive(pid) {
                let _ = run(&["ip", "netns", "del", name]);
                removed += 1;
            }
        }
    }
    if let Ok(dirs) = std::fs::read_dir(WORK_ROOT) {
        for d in dirs.filter_map(|e| e.ok()) {
            let pid = d.file_name().to_string_lossy().split('-').next().and_then(|p| p.parse::<i32>().ok());
            if pid.is_some_and(|p| !alive(p)) {
                let _ = std::fs::remove_dir_all(d.path());
            }
        }
    }
    removed
}
