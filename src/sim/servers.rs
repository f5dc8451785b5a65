//! flock's own small servers for the simulated cluster: on every declared port of a pod (or
//! probed port of a host), a TCP listener that accepts and closes, a UDP socket that
//! answers each datagram with itself, and an SCTP listener where the kernel has SCTP. One
//! thread per network namespace creates the sockets inside it (dual-stack `[::]` sockets,
//! IPv4 fallback) and serves them with `poll`, checking a stop flag between rounds.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6};

use crate::model::Protocol;
use crate::netns::{self, Netns};

enum Sock {
    Tcp(TcpListener),
    Udp(UdpSocket),
    Sctp(OwnedFd),
}

impl Sock {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Sock::Tcp(l) => l.as_fd(),
            Sock::Udp(u) => u.as_fd(),
            Sock::Sctp(f) => f.as_fd(),
        }
    }
}

/// Servers running in one namespace.
pub struct Servers {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Ports that could not be served because the kernel lacks the protocol (SCTP here).
    pub(crate) unavailable: Vec<(u16, Protocol)>,
}

impl Servers {
    /// Starts serving `ports` in `ns`. Fails if a TCP or UDP port cannot be bound.
    pub fn start(ns: Netns, ports: Vec<(u16, Protocol)>) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Result<Vec<(u16, Protocol)>, String>>();
        let flag = stop.clone();
        let desc = ns.describe();
        let thread = std::thread::Builder::new()
            .name("flock-sim-servers".into())
            .spawn(move || {
                let r = netns::run_in(&ns, move || {
                    let mut socks = Vec::new();
                    let mut unavailable = Vec::new();
                    for (port, proto) in ports {
                        match open(port, proto) {
                            Ok(Some(s)) => socks.push(s),
                            Ok(None) => unavailable.push((port, proto)),
                            Err(e) => {
                                let _ = tx.send(Err(format!("{proto}/{port}: {e}")));
                                return;
                            }
                        }
                    }
                    let _ = tx.send(Ok(unavailable));
                    serve(&socks, &flag);
                });
                if let Err(e) = r {
                    tracing::error!(error = %e, "sim servers could not enter their namespace");
                }
            })
            .map_err(|e| e.to_string())?;
        match rx.recv() {
            Ok(Ok(unavailable)) => Ok(Self { stop, thread: Some(thread), unavailable }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(format!("servers in {desc}: {e}"))
            }
            Err(_) => {
                let _ = thread.join();
                Err(format!("servers in {desc} did not start"))
            }
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens one server socket; `Ok(None)` when the kernel lacks the protocol.
fn open(port: u16, proto: Protocol) -> std::io::Result<Option<Sock>> {
    let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    let v4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    match proto {
        Protocol::Tcp => {
            let l = TcpListener::bind(v6).or_else(|_| TcpListener::bind(v4))?;
            l.set_nonblocking(true)?;
            Ok(Some(Sock::Tcp(l)))
        }
        Protocol::Udp => {
            let u = UdpSocket::bind(v6).or_else(|_| UdpSocket::bind(v4))?;
            u.set_nonblocking(true)?;
            Ok(Some(Sock::Udp(u)))
        }
        Protocol::Sctp => {
            let fd = match socket::socket(AddressFamily::Inet6, SockType::Stream, SockFlag::SOCK_NONBLOCK, SockProtocol::Sctp) {
                Ok(fd) => fd,
                Err(nix::Error::EPROTONOSUPPORT | nix::Error::ESOCKTNOSUPPORT | nix::Error::EAFNOSUPPORT) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let bound = socket::bind(fd.as_raw_fd(), &SockaddrIn6::from(std::net::SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0)));
            if bound.is_err() {
                let fd4 = socket::socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK, SockProtocol::Sctp)?;
                socket::bind(fd4.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)))?;
                socket::listen(&fd4, Backlog::new(64).unwrap_or(Backlog::MAXCONN))?;
                return Ok(Some(Sock::Sctp(fd4)));
            }
            socket::listen(&fd, Backlog::new(64).unwrap_or(Backlog::MAXCONN))?;
            Ok(Some(Sock::Sctp(fd)))
        }
    }
}

fn serve(socks: &[Sock], stop: &AtomicBool) {
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let mut fds: Vec<PollFd<'_>> = socks.iter().map(|s| PollFd::new(s.fd(), PollFlags::POLLIN)).collect();
        match poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "sim servers: poll failed");
                return;
            }
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN))).collect();
        drop(fds);
        for (s, r) in socks.iter().zip(ready) {
            if !r {
                continue;
            }
            match s {
                // A completed handshake is the probe's answer: accept and close.
                Sock::Tcp(l) => while l.accept().is_ok() {},
                Sock::Sctp(fd) => {
                    while let Ok(c) = socket::accept(fd.as_raw_fd()) {
                        let _ = nix::unistd::close(c);
                    }
                }
                Sock::Udp(u) => {
                    while let Ok((n, from)) = u.recv_from(&mut buf) {
                        let _ = u.send_to(&buf[..n], from);
                    }
                }
            }
        }
    }
}
