//! What the data-path benchmarks ([`crate::dataplane`] and [`crate::overlay`]) share: the
//! bench namespace's pods and server policy, throwaway network namespaces, the TCP server and
//! load generator (std threads, no external tool) and the statistics of their reports.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::socket::{self as sock, AddressFamily, SockFlag, SockType, SockaddrStorage, sockopt};
use serde_json::{Value, json};

use flock::model::{ContainerPort, LabelSelector, Labels, NetworkPolicy, Pod, PodPhase, PolicyPeer, PolicyPort, PolicyRule, PortRef};
use flock::netns::Netns;
use flock::sim::fabric::run as sh;
use flock_cni::testing::{NetnsGuard, PREFIX};

/// The port the hand-built scenarios' server listens on and their policies allow.
pub(crate) const PORT: u16 = 8080;

/// What a client sends and the server answers: a few bytes each way.
pub(crate) const REQUEST: &[u8] = b"ping\n";
const REPLY: &[u8] = b"pong\n";
/// A connect that takes longer failed (a SYN retransmitted after 1 s still makes it).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(3);

/// Conntrack timeouts (seconds) in the node namespace, so closed connections leave the
/// table within the round (the defaults are 10 s and 120 s).
pub(crate) const CT_TIMEOUTS: [(&str, &str); 2] =
    [("net.netfilter.nf_conntrack_tcp_timeout_close", "1"), ("net.netfilter.nf_conntrack_tcp_timeout_time_wait", "1")];

/// The namespace of the hand-built scenarios.
pub(crate) const NS: &str = "bench";

/// Pod `name` of namespace [`NS`], running on `node` with one address.
pub(crate) fn pod(name: &str, labels: Labels, node: &str, ip: IpAddr, ports: Vec<ContainerPort>) -> Pod {
    Pod {
        namespace: NS.into(),
        name: name.into(),
        uid: flock::model::derived_uid(NS, name),
        labels,
        node: Some(node.into()),
        phase: PodPhase::Running,
        ips: vec![ip],
        host_network: false,
        ports,
        created: None,
        unpublished: false,
    }
}

/// A policy selecting the server, allowing TCP [`PORT`] from `peers` in one ingress rule.
pub(crate) fn server_policy(name: String, peers: Vec<PolicyPeer>) -> NetworkPolicy {
    let mut server = LabelSelector::default();
    server.match_labels.insert("app".into(), "server".into());
    NetworkPolicy {
        audit: false,
        namespace: NS.into(),
        name,
        pod_selector: server,
        policy_types: vec!["Ingress".into()],
        ingress: vec![PolicyRule {
            peers,
            ports: vec![PolicyPort { protocol: Some("TCP".into()), port: Some(PortRef::Number(i32::from(PORT))), end_port: None }],
        }],
        egress: vec![],
        generation: None,
        egress_domains: None,
    }
}

/// A namespace named `flkt-<pid>-dp<n>-<tag>`: swept like the test namespaces, deleted on drop.
pub(crate) fn netns(tag: &str) -> anyhow::Result<NetnsGuard> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!("{PREFIX}{}-dp{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    sh(&["ip", "netns", "add", &name]).context("creating a network namespace")?;
    let guard = NetnsGuard { name };
    sh(&["ip", "-n", &guard.name, "link", "set", "lo", "up"])?;
    Ok(guard)
}

/// Sets `key` in namespace `ns`.
pub(crate) fn sysctl(ns: &NetnsGuard, key: &str, value: &str) -> anyhow::Result<()> {
    flock::sim::fabric::sysctl(&ns.name, key, value)?;
    Ok(())
}

/// The namespace's file, for entering it.
pub(crate) fn path(ns: &NetnsGuard) -> PathBuf {
    Path::new("/run/netns").join(&ns.name)
}

/// Load per slice: the two tables take turns in slices this long (ABBA…), so load from
/// elsewhere on the machine that comes and goes hits both alike.
pub(crate) const SLICE: Duration = Duration::from_millis(250);
/// Load before each round's first slice of a side, not counted.
pub(crate) const WARM_UP: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------
// The load generator.

/// Accept loops on a listener in the server's namespace; stopped (and joined) on drop.
pub(crate) struct Server {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Answers each connection's request ([`serve`]).
    pub(crate) fn start(ns: &Path, addr: SocketAddr, threads: usize) -> anyhow::Result<Self> {
        Self::serving(ns, addr, threads, |conn| {
            // Errors of one connection (a reset, a timeout) end that connection.
            let _ = serve(conn);
        })
    }

    /// Hands each connection to `handle`, on `threads` accept loops.
    pub(crate) fn serving(
        ns: &Path,
        addr: SocketAddr,
        threads: usize,
        handle: impl Fn(TcpStream) + Clone + Send + 'static,
    ) -> anyhow::Result<Self> {
        // The socket belongs to the namespace it was created in, whichever thread uses it.
        let listener = flock::netns::run_in(&Netns::Path(ns.to_path_buf()), || listen(addr))??;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let (l, stop, handle) = (listener.clone(), stop.clone(), handle.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((conn, _)) = l.accept() {
                            handle(conn);
                        }
                    }
                })
            })
            .collect();
        Ok(Self { listener, stop, threads })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A shut-down listening socket wakes its accept() with EINVAL.
        let _ = sock::shutdown(self.listener.as_raw_fd(), sock::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A listening TCP socket with a backlog of 4096 (std's is 128).
fn listen(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let fd = socket_for(addr)?;
    sock::setsockopt(&fd, sockopt::ReuseAddr, &true).context("SO_REUSEADDR")?;
    sock::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr)).with_context(|| format!("binding {addr}"))?;
    sock::listen(&fd, sock::Backlog::new(4096).context("backlog")?).with_context(|| format!("listening on {addr}"))?;
    Ok(TcpListener::from(fd))
}

fn socket_for(addr: SocketAddr) -> anyhow::Result<OwnedFd> {
    let family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    sock::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).context("creating a TCP socket")
}

fn serve(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < REQUEST.len() {
        match conn.read(&mut buf[got..])? {
            0 => return Ok(()),
            n => got += n,
        }
    }
    conn.write_all(REPLY)
}

/// One connection from `src` (or the namespace's choice) to `dst`: connect within `timeout`,
/// request, reply, reset.
fn connect_once(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let io = |e: nix::Error| std::io::Error::from(e);
    let family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = sock::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(io)?;
    if let Some(src) = src {
        sock::bind(fd.as_raw_fd(), &SockaddrStorage::from(SocketAddr::new(src, 0))).map_err(io)?;
    }
    // A blocking connect gives up after SO_SNDTIMEO (EINPROGRESS).
    let tv = nix::sys::time::TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
    sock::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(io)?;
    sock::setsockopt(&fd, sockopt::ReceiveTimeout, &tv).map_err(io)?;
    match sock::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) => {}
        Err(nix::Error::EINPROGRESS) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
        Err(e) => return Err(e.into()),
    }
    // Reset on close: no TIME_WAIT on either side, so ports never run out.
    sock::setsockopt(&fd, sockopt::Linger, &nix::libc::linger { l_onoff: 1, l_linger: 0 }).map_err(io)?;
    let mut conn = TcpStream::from(fd);
    conn.write_all(REQUEST)?;
    let mut buf = [0u8; REPLY.len()];
    conn.read_exact(&mut buf)?;
    if buf != REPLY {
        return Err(std::io::Error::other("unexpected reply"));
    }
    Ok(())
}

/// One connection in `ns` (a thread of its own enters it).
pub(crate) fn probe(ns: &Path, src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    flock::netns::run_in(&Netns::Path(ns.to_path_buf()), || connect_once(src, dst, timeout))?
        .with_context(|| format!("connecting in {}", ns.display()))
}

/// What one measurement saw.
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) slowest: Duration,
}

impl Load {
    pub(crate) fn add(&mut self, other: &Load) {
        self.completed += other.completed;
        self.failed += other.failed;
        self.elapsed += other.elapsed;
        self.slowest = self.slowest.max(other.slowest);
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    pub(crate) fn rate(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// A failed connection is an error, not a number.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.failed > 0 {
            bail!(
                "{} of {} connections failed, first: {}",
                self.failed,
                self.failed + self.completed,
                self.first_error.as_deref().unwrap_or("?")
            );
        }
        if self.completed == 0 {
            bail!("no connection completed");
        }
        Ok(())
    }
}

/// `threads` client threads in `ns`, each connecting to `dst` one connection after the other
/// for `duration`.
pub(crate) fn load(ns: &Path, dst: SocketAddr, threads: usize, duration: Duration) -> anyhow::Result<Load> {
    let start = std::sync::Barrier::new(threads + 1);
    let ns_file = File::open(ns).with_context(|| format!("opening {}", ns.display()))?;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (start, ns_file) = (&start, &ns_file);
                scope.spawn(move || {
                    let entered = nix::sched::setns(ns_file, nix::sched::CloneFlags::CLONE_NEWNET);
                    start.wait();
                    let mut out = Load::default();
                    if let Err(e) = entered {
                        out.failed = 1;
                        out.first_error = Some(format!("entering {}: {e}", ns.display()));
                        return out;
                    }
                    let deadline = Instant::now() + duration;
                    loop {
                        let t = Instant::now();
                        if t >= deadline {
                            break;
                        }
                        match connect_once(None, dst, CONNECT_TIMEOUT) {
                            Ok(()) => {
                                out.completed += 1;
                                out.slowest = out.slowest.max(t.elapsed());
                            }
                            Err(e) => {
                                out.failed += 1;
                                out.first_error.get_or_insert_with(|| format!("{dst}: {e}"));
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let mut total = Load::default();
        for w in workers {
            let Ok(l) = w.join() else { bail!("a client thread panicked") };
            total.completed += l.completed;
            total.failed += l.failed;
            total.slowest = total.slowest.max(l.slowest);
            if total.first_error.is_none() {
                total.first_error = l.first_error;
            }
        }
        total.elapsed = began.elapsed();
        Ok(total)
    })
}

// ---------------------------------------------------------------------------------------
// Statistics.

/// The middle value of `v` (the upper one of an even count), for seconds and ratios alike.
pub fn median<T: Copy + Default + PartialOrd>(v: &[T]) -> T {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s.get(s.len() / 2).copied().unwrap_or_default()
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

pub(crate) fn spread(v: &[f64]) -> Value {
    json!({
        "median": round3(median(v)),
        "min": round3(v.iter().copied().fold(f64::INFINITY, f64::min)),
        "max": round3(v.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
    })
}
