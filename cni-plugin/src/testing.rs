//! Real-kernel test support shared by every crate of the workspace: the root gate,
//! throwaway network namespaces with RAII cleanup, and a sweep of leftovers from crashed
//! runs. (Test support, not used by the plugin itself; here so that flock-cni's own tests and
//! flock's can share it — flock-cni is the crate both depend on.)
//!
//! Kernel tests call [`require_root`] first. With `FLOCK_REQUIRE_ROOT=1` (CI) a missing
//! capability fails the test; otherwise the test prints why it is skipped and passes. When
//! `FLOCK_KERNEL_TEST_LOG` names a file, every call appends `RAN <test>` or
//! `SKIPPED <test>: <why>` to it, so `tests/run.sh` can count kernel tests that ran and that
//! were skipped (a skipped kernel test is never a silent `ok`).
//! Every namespace is named `flkt-<pid>-<n>-<tag>`; [`sweep`] removes those whose process is
//! gone, so a killed run leaves nothing behind for the next one.

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
            record(&format!("RAN {test}"));
            sweep();
            true
        }
        Some(why) if required => panic!("{test}: FLOCK_REQUIRE_ROOT=1 but kernel tests cannot run: {why}"),
        Some(why) => {
            record(&format!("SKIPPED {test}: {why}"));
            eprintln!("SKIP {test}: needs root, ip and nft ({why}); set FLOCK_REQUIRE_ROOT=1 to make this a failure");
            false
        }
    }
}

/// Appends one line to `$FLOCK_KERNEL_TEST_LOG`, if set (one `write` of an `O_APPEND` file:
/// lines from parallel tests do not interleave).
fn record(line: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("FLOCK_KERNEL_TEST_LOG") else { return };
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    if let Err(e) = file.and_then(|mut f| f.write_all(format!("{line}\n").as_bytes())) {
        eprintln!("cannot record a kernel test in {}: {e}", std::path::Path::new(&path).display());
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

/// What [`forge_neighbour_requests`] sends.
#[derive(Debug, Clone, Copy)]
pub enum Forged<'a> {
    /// ARP requests for `target` from senders 198.18.200.1, .2, …
    Arp { target: &'a str },
    /// IPv6 neighbour solicitations for fe80::1 from `prefix` + 1, + 2, … with hop limit `hop`.
    Solicitation { prefix: &'a str, hop: u8 },
    /// IPv6 router solicitations (to ff02::2) from `prefix` + 1, + 2, …, hop limit 255.
    RouterSolicitation { prefix: &'a str },
    /// IPv6 neighbour solicitations for fe80::1, all from `source`, hop limit 255.
    SolicitationsFrom { source: &'a str },
}

/// Sends `count` forged frames from `pod`'s `eth0` (a raw socket in the pod's namespace, as
/// an attacker with CAP_NET_RAW would), each with the pod's MAC as its link-layer address.
#[allow(clippy::panic)]
pub fn forge_neighbour_requests(pod: &NetnsGuard, what: Forged<'_>, count: u32) {
    const SCRIPT: &str = r#"
import socket, struct, sys, ipaddress
kind, arg, hop, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
mac = open("/sys/class/net/eth0/address").read().strip()
src = bytes.fromhex(mac.replace(":", ""))
def csum(b):
    if len(b) % 2: b += b"\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16: t = (t & 0xffff) + (t >> 16)
    return (~t) & 0xffff
for i in range(1, count + 1):
    if kind == "arp":
        spa = socket.inet_aton("198.18.200.%d" % (i % 254 + 1))
        arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + src + spa + b"\0" * 6 + socket.inet_aton(arg)
        s.send(b"\xff" * 6 + src + b"\x08\x06" + arp)
    elif kind == "rs":
        saddr = (ipaddress.IPv6Address(arg) + i).packed
        daddr = ipaddress.IPv6Address("ff02::2").packed
        body = struct.pack("!BBHI", 133, 0, 0, 0) + bytes([1, 1]) + src
        c = csum(saddr + daddr + struct.pack("!IxxxB", len(body), 58) + body)
        body = body[:2] + struct.pack("!H", c) + body[4:]
        ip6 = struct.pack("!IHBB", 0x60000000, len(body), 58, 255) + saddr + daddr
        s.send(bytes.fromhex("333300000002") + src + b"\x86\xdd" + ip6 + body)
    else:
        saddr = (ipaddress.IPv6Address(arg) + (0 if kind == "ns-from" else i)).packed
        target = ipaddress.IPv6Address("fe80::1").packed
        daddr = ipaddress.IPv6Address("ff02::1:ff00:1").packed
        body = struct.pack("!BBHI", 135, 0, 0, 0) + target + bytes([1, 1]) + src
        pseudo = saddr + daddr + struct.pack("!IxxxB", len(body), 58)
        c = csum(pseudo + body)
        body = body[:2] + struct.pack("!H", c) + body[4:]
        ip6 = struct.pack("!IHBB", 0x60000000, len(body), 58, hop) + saddr + daddr
        s.send(bytes.fromhex("3333ff000001") + src + b"\x86\xdd" + ip6 + body)
"#;
    let (kind, arg, hop) = match what {
        Forged::Arp { target } => ("arp", target.to_string(), 0),
        Forged::Solicitation { prefix, hop } => ("ns", prefix.to_string(), hop),
        Forged::RouterSolicitation { prefix } => ("rs", prefix.to_string(), 255),
        Forged::SolicitationsFrom { source } => ("ns-from", source.to_string(), 255),
    };
    let out = pod.try_exec(&["python3", "-c", SCRIPT, kind, &arg, &hop.to_string(), &count.to_string()]);
    if !out.status.success() {
        panic!("forging {kind}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The neighbour entries of `iface` in `ns` (both families, every state: `ip neigh` hides
/// `NOARP` entries unless asked) whose address starts with one of `prefixes`, as `ip neigh`
/// prints them.
pub fn neighbours_of(ns: &NetnsGuard, iface: &str, prefixes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for fam in ["-4", "-6"] {
        let listed = ns.ip(&[fam, "neigh", "show", "nud", "all", "dev", iface]);
        for line in String::from_utf8_lossy(&listed.stdout).lines() {
            if prefixes.iter().any(|p| line.starts_with(p)) {
                out.push(line.to_string());
            }
        }
    }
    out
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

/// A stand-in for flock-agent on a unix socket: answers every request with `handler` and
/// records what it was asked. Stops (and removes its socket) on drop.
pub struct FakeAgent {
    pub socket: std::path::PathBuf,
    pub requests: std::sync::Arc<std::sync::Mutex<Vec<crate::protocol::Request>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How the fake agent answers.
pub type Handler = dyn Fn(&crate::protocol::Request) -> crate::protocol::Reply + Send + Sync;

impl FakeAgent {
    /// Acknowledges everything at once.
    pub fn acking(socket: &std::path::Path) -> Self {
        Self::start(socket, std::sync::Arc::new(|_| crate::protocol::Reply::ok()))
    }

    /// Serves `socket` with `handler` (each connection on its own thread, so parallel ADDs
    /// are answered in parallel).
    #[allow(clippy::panic)]
    pub fn start(socket: &std::path::Path, handler: std::sync::Arc<Handler>) -> Self {
        use std::io::{BufReader, Write};
        let _ = std::fs::remove_file(socket);
        let listener = match std::os::unix::net::UnixListener::bind(socket) {
            Ok(l) => l,
            Err(e) => panic!("cannot bind {}: {e}", socket.display()),
        };
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (log, halt) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if halt.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (log, handler) = (log.clone(), handler.clone());
                std::thread::spawn(move || {
                    let Ok(read_half) = conn.try_clone() else { return };
                    let mut r = BufReader::new(read_half);
                    let reply = match crate::protocol::read_line(&mut r) {
                        Ok(Some(line)) => match crate::protocol::decode_request(&line) {
                            Ok(req) => {
                                let reply = handler(&req);
                                if let Ok(mut l) = log.lock() {
                                    l.push(req);
                                }
                                reply
                            }
                            Err(e) => crate::protocol::Reply::refused(e),
                        },
                        _ => return,
                    };
                    let mut w = conn;
                    let _ = w.write_all(&crate::protocol::encode_reply(&reply));
                });
            }
        });
        Self { socket: socket.to_path_buf(), requests, stop, thread: Some(thread) }
    }

    /// The requests received so far.
    pub fn seen(&self) -> Vec<crate::protocol::Request> {
        self.requests.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept loop.
        let _ = std::os::unix::net::UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A temporary directory removed on drop.
pub struct TempDir {
    pub path: std::path::PathBuf,
}

impl TempDir {
    #[allow(clippy::panic)]
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{PREFIX}{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        if let Err(e) = std::fs::create_dir_all(&path) {
            panic!("cannot create {}: {e}", path.display());
        }
        Self { path }
    }

    pub fn join(&self, p: &str) -> std::path::PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
