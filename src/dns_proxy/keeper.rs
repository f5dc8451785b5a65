//! The socket keeper: sockets that outlive the agent's process. `flock-socket-keeper` (its
//! own small DaemonSet, updated only by hand) holds descriptors the agent deposits and hands
//! them to the next agent, over a unix socket (`SOCK_SEQPACKET`, `SCM_RIGHTS`). The agent's
//! DNS proxy keeps its listeners there: while the agent restarts, is killed or is upgraded,
//! the listeners stay open, so the queries the table steers to them wait in the kernel (the
//! UDP receive queue, the TCP accept backlog) instead of being dropped, and the next agent
//! answers them. The keeper reads no packet and needs no capability: a descriptor keeps its
//! socket in the namespace it was made in.
//!
//! This module owns the protocol, the keeper's store and loop ([`listen`], [`serve`]) and the
//! agent's client ([`Keeper`]). One request per connection, one reply:
//! `GET <name>` → `OK <n>` with the `n` descriptors held under `name` (duplicates: the keeper
//! keeps its own); `PUT <name>` with descriptors → `OK <n>` (they replace what was held; none
//! clears it); anything else → `ERR <why>`. Only a peer with the keeper's own uid is served
//! (and the socket is mode 0600), a request is bounded in size, descriptors ([`MAX_FDS`]) and
//! time ([`TIMEOUT`]), and the store in names ([`MAX_NAMES`]).
//!
//! Clients are served side by side, each on a thread of its own with its own deadline
//! ([`MAX_CLIENTS`] at once; one more is told `ERR busy` at once): a client that connects and
//! says nothing holds only its own thread until [`TIMEOUT`], never the next agent's hand-over.
//! The store is locked only to answer a request (the descriptors a GET hands out are
//! duplicated under the lock and sent after it).

use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

// rustix, not nix, for this module: it receives descriptors as `OwnedFd`s, which nix hands
// out only as raw numbers (owning those takes `unsafe`, which this crate forbids).
use rustix::io::Errno;
use rustix::net::{
    self as net, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType, sockopt,
};

/// flock-socket-keeper's socket, and the agent's `--dns-socket-keeper` in deploy/.
pub const DEFAULT_SOCKET: &str = "/run/flock/socket-keeper.sock";
/// The name the DNS proxy's listeners are kept under (versioned: an agent whose listeners
/// differ in kind takes none of another version's).
pub const DNS_PROXY: &str = "dns-proxy-v1";
/// Descriptors per name.
pub const MAX_FDS: usize = 8;
/// Names the keeper holds.
pub const MAX_NAMES: usize = 8;
/// How long one exchange may take, either side.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Clients served at once. Each is one thread for at most twice [`TIMEOUT`] (its request,
/// then its reply); an agent makes one exchange every 10 s.
pub const MAX_CLIENTS: usize = 16;
/// A request's or reply's text (`PUT ` and a name of at most 32 bytes fit well inside).
const MAX_MESSAGE: usize = 64;

/// What went wrong talking to (or being) the keeper.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("socket keeper {path}: cannot connect: {source}")]
    Connect { path: PathBuf, source: Errno },
    #[error("socket keeper {path}: {op}: {source}")]
    Io { path: PathBuf, op: &'static str, source: Errno },
    #[error("socket keeper {path}: {message}")]
    Refused { path: PathBuf, message: String },
    #[error("socket keeper {path}: cannot listen: {source}")]
    Listen { path: PathBuf, source: std::io::Error },
}

/// The agent's side: takes and deposits descriptors at the keeper's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keeper {
    path: PathBuf,
}

impl Keeper {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptors held under `name` (none: nothing is held).
    pub fn take(&self, name: &str) -> Result<Vec<OwnedFd>, KeeperError> {
        self.exchange(&format!("GET {name}"), &[])
    }

    /// Makes `fds` what is held under `name` (empty: holds nothing).
    pub fn deposit(&self, name: &str, fds: &[BorrowedFd<'_>]) -> Result<(), KeeperError> {
        self.exchange(&format!("PUT {name}"), fds).map(drop)
    }

    fn exchange(&self, request: &str, fds: &[BorrowedFd<'_>]) -> Result<Vec<OwnedFd>, KeeperError> {
        let io = |op, source| KeeperError::Io { path: self.path.clone(), op, source };
        let sock = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).map_err(|e| io("socket", e))?;
        bound_in_time(&sock).map_err(|e| io("timeouts", e))?;
        let connect = |source| KeeperError::Connect { path: self.path.clone(), source };
        let addr = SocketAddrUnix::new(&self.path).map_err(connect)?;
        net::connect(&sock, &addr).map_err(connect)?;
        if let Err(e) = send(&sock, request.as_bytes(), fds) {
            // A busy keeper answers and closes before reading: its reason is waiting.
            if let Ok((reply, _)) = receive(&sock).or_else(|_| receive(&sock))
                && reply.starts_with(b"ERR ")
            {
                return Err(KeeperError::Refused { path: self.path.clone(), message: String::from_utf8_lossy(&reply).into_owned() });
            }
            return Err(io("send", e));
        }
        let (reply, got) = match receive(&sock) {
            // A busy keeper closes without reading the request: the kernel reports that reset
            // (once) before the reply queued ahead of it.
            Err(Errno::CONNRESET) => receive(&sock),
            r => r,
        }
        .map_err(|e| io("receive", e))?;
        let reply = String::from_utf8_lossy(&reply).into_owned();
        match reply.strip_prefix("OK ").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if request.starts_with("GET") && n == got.len() => Ok(got),
            Some(n) if request.starts_with("PUT") && n == fds.len() && got.is_empty() => Ok(got),
            _ => Err(KeeperError::Refused { path: self.path.clone(), message: reply }),
        }
    }
}

/// How long the keeper holds what was not deposited again (an agent deposits every 10 s).
/// Past it, what waits in the sockets is stale for every client, and an agent that does not
/// use the keeper (a rollback, the flag unset) could not bind their addresses while they
/// are held.
pub const EXPIRY: Duration = Duration::from_secs(60);

/// What the keeper holds, by name, with when it was deposited.
#[derive(Debug, Default)]
pub struct Store {
    held: BTreeMap<String, (Vec<OwnedFd>, std::time::Instant)>,
}

/// The store's answer to one request: the reply's text and the descriptors that go with it.
#[derive(Debug)]
pub struct Reply<'a> {
    pub text: String,
    pub fds: Vec<BorrowedFd<'a>>,
}

impl Store {
    /// Drops what was deposited longer than [`EXPIRY`] before `now`; the names dropped.
    pub fn expire(&mut self, now: std::time::Instant) -> Vec<String> {
        let old: Vec<String> = self.held.iter().filter(|(_, (_, at))| now.duration_since(*at) > EXPIRY).map(|(n, _)| n.clone()).collect();
        for n in &old {
            self.held.remove(n);
        }
        old
    }

    /// Answers one request (`fds`: the descriptors that came with it), at `now`.
    pub fn handle(&mut self, request: &[u8], fds: Vec<OwnedFd>, now: std::time::Instant) -> Reply<'_> {
        let refuse = |why: &str| Reply { text: format!("ERR {why}"), fds: Vec::new() };
        let request = String::from_utf8_lossy(request);
        let Some((verb, name)) = request.split_once(' ') else {
            return refuse("not GET or PUT <name>");
        };
        if name.is_empty() || name.len() > 32 || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return refuse("a name is 1 to 32 of a-z, 0-9 and -");
        }
        match verb {
            "GET" if fds.is_empty() => {
                let held = self.held.get(name).map(|(v, _)| v.iter().map(|f| f.as_fd()).collect()).unwrap_or_default();
                Reply { text: format!("OK {}", Vec::len(&held)), fds: held }
            }
            "PUT" if fds.len() > MAX_FDS => refuse("too many descriptors"),
            "PUT" if !self.held.contains_key(name) && self.held.len() >= MAX_NAMES && !fds.is_empty() => refuse("too many names"),
            "PUT" => {
                let n = fds.len();
                if fds.is_empty() {
                    self.held.remove(name);
                } else {
                    self.held.insert(name.to_string(), (fds, now));
                }
                Reply { text: format!("OK {n}"), fds: Vec::new() }
            }
            _ => refuse("not GET or PUT <name>"),
        }
    }

    /// Descriptors held under `name`.
    pub fn held(&self, name: &str) -> usize {
        self.held.get(name).map_or(0, |(v, _)| v.len())
    }
}

/// The keeper's listening socket at `path` (a stale one from a previous keeper replaced),
/// mode 0600.
pub fn listen(path: &Path) -> Result<OwnedFd, KeeperError> {
    let fail = |source| KeeperError::Listen { path: path.to_path_buf(), source };
    let errno = |e: Errno| fail(e.into());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            // A keeper that still answers keeps its socket (and what it holds).
            if Keeper::new(path).take("probe").is_ok() {
                return Err(fail(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another socket keeper answers there")));
            }
            std::fs::remove_file(path).map_err(fail)?;
        }
        Ok(_) => return Err(fail(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "not a socket"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let sock = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).map_err(errno)?;
    net::bind(&sock, &SocketAddrUnix::new(path).map_err(errno)?).map_err(errno)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    net::listen(&sock, 16).map_err(errno)?;
    Ok(sock)
}

/// Serves `listener` (from [`listen`]) forever, clients side by side (each on its own
/// thread, bounded by [`TIMEOUT`]); returns only if accepting fails.
pub fn serve(listener: &OwnedFd, store: &Mutex<Store>) -> Errno {
    let uid = nix::unistd::geteuid().as_raw();
    // accept wakes at least this often, to expire what is no longer deposited.
    if let Err(e) = sockopt::set_socket_timeout(listener, sockopt::Timeout::Recv, Some(EXPIRY / 4)) {
        return e;
    }
    let clients = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        loop {
            for name in lock(store).expire(std::time::Instant::now()) {
                tracing::info!(name, "socket keeper: closed sockets no agent deposited again within {}s", EXPIRY.as_secs());
            }
            let conn = match net::accept_with(listener, SocketFlags::CLOEXEC) {
                Ok(fd) => fd,
                Err(Errno::INTR | Errno::CONNABORTED | Errno::AGAIN) => continue,
                Err(e) => return e,
            };
            if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                clients.fetch_sub(1, Ordering::SeqCst);
                // A fresh connection's buffer is empty: this send does not wait.
                let _ = bound_in_time(&conn).and_then(|()| send(&conn, b"ERR busy", &[]));
                tracing::warn!(limit = MAX_CLIENTS, "socket keeper: refused a client: as many are being served");
                continue;
            }
            let clients = &clients;
            let spawned = std::thread::Builder::new().name("keeper-client".into()).spawn_scoped(scope, move || {
                if let Err(e) = one(&conn, store, uid) {
                    tracing::warn!(error = %e, "socket keeper: a request failed");
                }
                drop(conn);
                clients.fetch_sub(1, Ordering::SeqCst);
            });
            if let Err(e) = spawned {
                clients.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(error = %e, "socket keeper: cannot start a thread for a client; it is closed");
            }
        }
    })
}

/// The store, even if a client's thread panicked while holding it (its state is whole: every
/// change is one map operation).
fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

fn one(conn: &OwnedFd, store: &Mutex<Store>, uid: u32) -> Result<(), Errno> {
    bound_in_time(conn)?;
    // nix's, not rustix's: across PID namespaces (the agent's pod and the keeper's) the
    // kernel reports pid 0, which rustix's credentials cannot hold.
    let peer =
        nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials).map_err(|e| Errno::from_raw_os_error(e as i32))?;
    let pid = peer.pid();
    if peer.uid() != uid {
        tracing::warn!(pid, uid = peer.uid(), "socket keeper: refused a peer of another user");
        return send(conn, b"ERR not the keeper's user", &[]);
    }
    let (request, fds) = receive(conn)?;
    let (verb, count) = (String::from_utf8_lossy(request.get(..3).unwrap_or_default()).into_owned(), fds.len());
    // Answered under the lock, sent after it: a client that does not read its reply holds
    // only its own thread.
    let (text, out) = {
        let mut store = lock(store);
        let reply = store.handle(&request, fds, std::time::Instant::now());
        let out: Result<Vec<OwnedFd>, Errno> =
            reply.fds.iter().map(|f| f.try_clone_to_owned().map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))).collect();
        (reply.text, out?)
    };
    match text.strip_prefix("ERR ") {
        Some(why) => tracing::warn!(pid, why, "socket keeper: refused a request"),
        None if verb == "PUT" => tracing::info!(pid, sockets = count, "socket keeper: holding the agent's sockets"),
        None => tracing::info!(pid, sockets = out.len(), "socket keeper: handed its sockets to an agent"),
    }
    let borrowed: Vec<BorrowedFd<'_>> = out.iter().map(AsFd::as_fd).collect();
    send(conn, text.as_bytes(), &borrowed)
}

fn bound_in_time(fd: &OwnedFd) -> Result<(), Errno> {
    sockopt::set_socket_timeout(fd, sockopt::Timeout::Recv, Some(TIMEOUT))?;
    sockopt::set_socket_timeout(fd, sockopt::Timeout::Send, Some(TIMEOUT))
}

fn send(fd: &OwnedFd, text: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::MSGSIZE);
    }
    // NOSIGNAL: a peer that went away is an error, not a SIGPIPE.
    net::sendmsg(fd, &[IoSlice::new(text)], &mut control, SendFlags::NOSIGNAL).map(drop)
}

/// One message and the descriptors that came with it (owned: closed if unused). More than
/// [`MAX_FDS`] descriptors or a longer text is an error (what came is closed).
fn receive(fd: &OwnedFd) -> Result<(Vec<u8>, Vec<OwnedFd>), Errno> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = net::recvmsg(fd, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = c {
            fds.extend(got);
        }
    }
    if msg.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
        return Err(Errno::MSGSIZE);
    }
    Ok((buf.get(..msg.bytes).unwrap_or_default().to_vec(), fds))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe().unwrap()
    }

    fn now() -> std::time::Instant {
        std::time::Instant::now()
    }

    #[test]
    fn what_is_not_deposited_again_expires() {
        let mut s = Store::default();
        let t0 = now();
        let (a, _b) = pipe();
        s.handle(b"PUT dns-proxy", vec![a], t0);
        assert!(s.expire(t0 + EXPIRY).is_empty());
        let (c, _d) = pipe();
        s.handle(b"PUT other", vec![c], t0 + EXPIRY);
        assert_eq!(s.expire(t0 + EXPIRY + Duration::from_secs(1)), vec!["dns-proxy".to_string()]);
        assert_eq!((s.held("dns-proxy"), s.held("other")), (0, 1));
    }

    #[test]
    fn the_store_holds_replaces_and_clears() {
        let mut s = Store::default();
        assert_eq!(s.handle(b"GET dns-proxy", vec![], now()).text, "OK 0");
        let (a, b) = pipe();
        assert_eq!(s.handle(b"PUT dns-proxy", vec![a, b], now()).text, "OK 2");
        let r = s.handle(b"GET dns-proxy", vec![], now());
        assert_eq!((r.text.as_str(), r.fds.len()), ("OK 2", 2));
        let (c, _d) = pipe();
        assert_eq!(s.handle(b"PUT dns-proxy", vec![c], now()).text, "OK 1");
        assert_eq!(s.held("dns-proxy"), 1);
        assert_eq!(s.handle(b"PUT dns-proxy", vec![], now()).text, "OK 0");
        assert_eq!(s.held("dns-proxy"), 0);
    }

    #[test]
    fn the_store_refuses_what_it_does_not_understand() {
        let mut s = Store::default();
        for bad in [&b"GET"[..], b"GET ", b"GET Dns", b"GET ../x", b"DEL dns", b"", b"GET aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"] {
            assert!(s.handle(bad, vec![], now()).text.starts_with("ERR "), "{}", String::from_utf8_lossy(bad));
        }
        // A GET carrying descriptors is not a GET.
        let (a, _b) = pipe();
        assert!(s.handle(b"GET x", vec![a], now()).text.starts_with("ERR "));
        let many: Vec<OwnedFd> = (0..=MAX_FDS / 2)
            .flat_map(|_| {
                let (a, b) = pipe();
                [a, b]
            })
            .collect();
        assert!(s.handle(b"PUT x", many, now()).text.starts_with("ERR "));
        for i in 0..MAX_NAMES {
            let (a, _b) = pipe();
            assert_eq!(s.handle(format!("PUT n{i}").as_bytes(), vec![a], now()).text, "OK 1");
        }
        let (a, _b) = pipe();
        assert!(s.handle(b"PUT one-too-many", vec![a], now()).text.starts_with("ERR "));
    }

    /// A keeper on a real socket: an agent deposits a pipe's write end, the "next agent"
    /// takes it and writes into the same pipe.
    #[test]
    fn descriptors_outlive_the_process_that_deposited_them() {
        let dir = flock_cni::testing::TempDir::new("keeper");
        let path = dir.join("k.sock");
        // Something else at the path is refused; a stale socket is replaced.
        std::fs::write(&path, "x").unwrap();
        assert!(listen(&path).unwrap_err().to_string().contains("not a socket"));
        std::fs::remove_file(&path).unwrap();
        drop(listen(&path).unwrap());
        let listener = listen(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::thread::spawn(move || serve(&listener, &Mutex::new(Store::default())));
        let k = Keeper::new(&path);
        assert!(k.take(DNS_PROXY).unwrap().is_empty());
        let (r, w) = pipe();
        k.deposit(DNS_PROXY, &[w.as_fd()]).unwrap();
        drop(w);
        let got = k.take(DNS_PROXY).unwrap();
        assert_eq!(got.len(), 1);
        nix::unistd::write(&got[0], b"x").unwrap();
        let mut b = [0u8; 1];
        assert_eq!(nix::unistd::read(&r, &mut b).unwrap(), 1);
        // A second keeper does not take over a keeper that answers.
        assert!(listen(&path).unwrap_err().to_string().contains("another socket keeper"));
        // An unknown verb is refused, by name.
        let e = k.exchange("DEL dns-proxy", &[]).unwrap_err();
        assert!(e.to_string().contains("ERR"), "{e}");
        // No keeper: a connect error naming the path.
        let e = Keeper::new(dir.join("none.sock")).take(DNS_PROXY).unwrap_err();
        assert!(e.to_string().contains("none.sock"), "{e}");
    }

    fn connect(path: &Path) -> OwnedFd {
        let sock = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        net::connect(&sock, &SocketAddrUnix::new(path).unwrap()).unwrap();
        sock
    }

    /// Whether the keeper has closed `c` (EOF or a reset) within 10 s, without answering.
    fn closed_unanswered(c: &OwnedFd) -> bool {
        sockopt::set_socket_timeout(c, sockopt::Timeout::Recv, Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; MAX_MESSAGE];
        matches!(net::recv(c, &mut buf, RecvFlags::empty()), Ok((0, _)) | Err(Errno::CONNRESET))
    }

    /// The attack: clients that connect and say nothing. The next agent's hand-over
    /// is served while they are all still connected (before the fix it waited for each to be
    /// cut, 2 s apiece); each is cut after [`TIMEOUT`]; one past [`MAX_CLIENTS`] is told
    /// busy at once, and served once they are gone.
    #[test]
    fn an_idle_client_stalls_no_one() {
        let dir = flock_cni::testing::TempDir::new("keeper-idle");
        let path = dir.join("k.sock");
        let listener = listen(&path).unwrap();
        std::thread::spawn(move || serve(&listener, &Mutex::new(Store::default())));
        let k = Keeper::new(&path);
        let (_r, w) = pipe();
        k.deposit(DNS_PROXY, &[w.as_fd()]).unwrap();

        let idle: Vec<OwnedFd> = (0..3).map(|_| connect(&path)).collect();
        let started = std::time::Instant::now();
        assert_eq!(k.take(DNS_PROXY).unwrap().len(), 1);
        assert_eq!(k.take(DNS_PROXY).unwrap().len(), 1);
        let took = started.elapsed();
        // Still connected and unanswered: the hand-overs did not wait for them.
        for c in &idle {
            let mut buf = [0u8; MAX_MESSAGE];
            assert_eq!(net::recv(c, &mut buf, RecvFlags::DONTWAIT).err(), Some(Errno::AGAIN), "an idle client was answered or cut early");
        }
        assert!(took < TIMEOUT, "two hand-overs took {took:?} beside three idle clients");
        for c in &idle {
            assert!(closed_unanswered(c), "an idle client was not cut");
        }

        // As many idle clients as the keeper serves at once: the next is refused at once...
        let idle: Vec<OwnedFd> = (0..MAX_CLIENTS).map(|_| connect(&path)).collect();
        let e = k.take(DNS_PROXY).unwrap_err();
        assert!(e.to_string().contains("ERR busy"), "{e}");
        // ...and served once they have been cut.
        for c in &idle {
            assert!(closed_unanswered(c));
        }
        let started = std::time::Instant::now();
        loop {
            match k.take(DNS_PROXY) {
                Ok(got) => break assert_eq!(got.len(), 1),
                Err(e) => assert!(started.elapsed() < Duration::from_secs(10), "not served after the idle clients went: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
