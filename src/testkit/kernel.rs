//! Real-kernel test support for flock's tests: the generic pieces (root gate, namespace
//! guards, sweep) come from `flock_cni::testing`; this adds routed "pods" wired the way
//! flock-cni wires them, for tests that do not go through the plugin.

use std::net::IpAddr;

pub use flock_cni::testing::*;

/// A routed node: one namespace acting as the host, forwarding enabled.
pub struct Node {
    pub ns: NetnsGuard,
}

/// A pod wired into a [`Node`] like flock-cni wires it: a veth whose host side is `iface`
/// (no address, ARP off, a /32 or /128 route and a permanent neighbour entry per pod
/// address) and whose pod side is `eth0` with the pod's addresses and a link-local default
/// gateway that is a permanent neighbour entry too.
pub struct Pod {
    pub ns: NetnsGuard,
    pub ips: Vec<IpAddr>,
}

impl Node {
    pub fn new(tag: &str) -> Self {
        let ns = NetnsGuard::new(tag);
        // A default route over an uplink, as every real node has (in the older wiring, proxy
        // ARP answers for the pods' gateway only when the node has a route to it via another
        // device).
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
        self.wire(tag, iface, ips, false)
    }

    /// [`Node::add_pod`] as flock-cni wired pods before it turned ARP off on the host side:
    /// proxy ARP answers for the gateway and both ends learn their neighbours. Attachments
    /// made before an upgrade still look like this, and for them flock's ruleset is the
    /// defence against forged neighbour discovery.
    pub fn add_pod_learning_neighbours(&self, tag: &str, iface: &str, ips: &[IpAddr]) -> Pod {
        self.wire(tag, iface, ips, true)
    }

    fn wire(&self, tag: &str, iface: &str, ips: &[IpAddr], learning: bool) -> Pod {
        let pod = NetnsGuard::new(tag);
        // The pod side's MAC as flock-cni sets it, so its link-local address is the one flock's
        // ruleset accepts neighbour discovery from (`flock_cni::pod_link_local`).
        let [a, b, c, d, e, f] = flock_cni::dataplane::pod_mac(iface);
        let lladdr = format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}");
        run(&[
            "ip",
            "-n",
            &self.ns.name,
            "link",
            "add",
            iface,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "address",
            &lladdr,
            "netns",
            &pod.name,
        ]);
        pod.sysctl("net.ipv6.conf.eth0.accept_dad", "0");
        self.ns.sysctl(&format!("net.ipv6.conf.{iface}.accept_dad"), "0");
        if learning {
            self.ns.sysctl(&format!("net.ipv4.conf.{iface}.proxy_arp"), "1");
            self.ns.sysctl(&format!("net.ipv4.neigh.{iface}.proxy_delay"), "0");
        } else {
            self.ns.ip(&["link", "set", iface, "arp", "off"]);
        }
        pod.ip(&["link", "set", "eth0", "up"]);
        self.ns.ip(&["link", "set", iface, "up"]);
        let mac = |ns: &NetnsGuard, dev: &str| {
            String::from_utf8_lossy(&ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")]).stdout).trim().to_string()
        };
        let (host_mac, pod_mac) = (mac(&self.ns, iface), mac(&pod, "eth0"));
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
            if !learning {
                self.ns.ip(&["neigh", "replace", &ip.to_string(), "lladdr", &pod_mac, "dev", iface, "nud", "permanent"]);
            }
        }
        let mut gateways = Vec::new();
        if ips.iter().any(IpAddr::is_ipv4) {
            gateways.push("169.254.1.1");
            pod.ip(&["route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"]);
            pod.ip(&["route", "add", "default", "via", "169.254.1.1", "dev", "eth0"]);
        }
        if has_v6 {
            gateways.push("fe80::1");
            self.ns.ip(&["-6", "addr", "add", "fe80::1/64", "dev", iface, "nodad"]);
            pod.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]);
        }
        if !learning {
            for gw in gateways {
                pod.ip(&["neigh", "replace", gw, "lladdr", &host_mac, "dev", "eth0", "nud", "permanent"]);
            }
        }
        Pod { ns: pod, ips: ips.to_vec() }
    }
}

/// The built `flock-cni` binary (next to the test executable's profile directory), built
/// on demand when missing.
pub fn flock_cni_binary() -> std::path::PathBuf {
    workspace_binary("flock-cni", "flock-cni")
}

/// The built binary `bin` of the workspace's package `package` (in the test executable's
/// profile directory: `cargo test --workspace` builds every package's binaries), built on
/// demand when missing.
#[allow(clippy::panic)]
pub fn workspace_binary(package: &str, bin: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> → target/<profile>/<bin>
    let profile_dir = exe.parent().and_then(|d| d.parent()).map(std::path::Path::to_path_buf).unwrap_or_default();
    let path = profile_dir.join(bin);
    if !path.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut args = vec!["build", "-p", package, "--bin", bin];
        // A bench runs from target/release: build the binary there.
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            args.push("--release");
        }
        let status = std::process::Command::new(cargo).args(&args).status();
        if !matches!(status, Ok(s) if s.success()) || !path.is_file() {
            panic!("{bin} is not built at {} and cargo build failed", path.display());
        }
    }
    path
}

/// Serves on a thread of its own inside `ns`, on a current-thread tokio runtime, until the
/// returned sender says stop (or is dropped); returns once `serve` has sent on its ready
/// channel (its sockets bound).
#[allow(clippy::panic)]
pub fn serve_in<F>(ns: crate::netns::Netns, serve: F) -> (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>)
where
    F: FnOnce(tokio::sync::watch::Receiver<bool>, std::sync::mpsc::Sender<()>) -> std::pin::Pin<Box<dyn Future<Output = ()>>>
        + Send
        + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let served = crate::netns::run_in(&ns, move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(serve(stop_rx, ready_tx)),
            Err(e) => panic!("a tokio runtime: {e}"),
        });
        if let Err(e) = served {
            panic!("serving in a namespace: {e}");
        }
    });
    if ready_rx.recv_timeout(std::time::Duration::from_secs(10)).is_err() {
        panic!("a server in a test namespace did not start");
    }
    (stop_tx, thread)
}

/// The DNS redirect as flock-agent programs it (without the policy judgement of `dns-steer`),
/// in `node`'s own `inet flock` table: UDP and TCP port 53 arriving on `iface` go to the
/// proxy's listeners on 127.0.0.1 and ::1 at `port` by tproxy (mark 0x40), what tproxy cannot
/// deliver (no proxy listening) is dropped; the proxy's upstream queries (packet mark
/// [`crate::render::DNS_UPSTREAM_MARK`]) mark their connections, whose answers are marked 0x40
/// too; policy routing (table 140) delivers marked packets locally. `extra` is added to the
/// table as written (sets, chains).
#[allow(clippy::panic)]
pub fn redirect_dns(node: &Node, iface: &str, port: u16, extra: &str) {
    let table = crate::render::names::TABLE;
    let (up, proxied) = (crate::render::DNS_UPSTREAM_MARK, crate::render::DNS_PROXIED_MARK);
    let script = format!(
        "table inet {table} {{\n{extra}\nchain dns-redirect {{\n type filter hook prerouting priority mangle; policy accept;\n\
         ct direction reply ct mark & {proxied:#x} == {proxied:#x} meta mark set 0x40 accept\n\
         iifname \"{iface}\" meta l4proto {{ tcp, udp }} th dport 53 meta mark set 0x40 tproxy ip to 127.0.0.1:{port} accept\n\
         iifname \"{iface}\" meta l4proto {{ tcp, udp }} th dport 53 meta mark set 0x40 tproxy ip6 to [::1]:{port} accept\n\
         iifname \"{iface}\" meta l4proto {{ tcp, udp }} th dport 53 drop\n}}\n\
         chain dns-upstream {{\n type filter hook output priority mangle; policy accept;\n\
         meta mark & {up:#x} == {up:#x} ct mark set ct mark | {proxied:#x}\n}}\n}}\n"
    );
    let path = std::env::temp_dir().join(format!("flkt-dns-{}-{iface}.nft", std::process::id()));
    if let Err(e) = std::fs::write(&path, script) {
        panic!("writing {}: {e}", path.display());
    }
    node.ns.exec(&["nft", "-f", &path.to_string_lossy()]);
    let _ = std::fs::remove_file(&path);
    for family in ["-4", "-6"] {
        node.ns.ip(&[family, "rule", "add", "fwmark", "0x40", "lookup", "140"]);
    }
    node.ns.ip(&["-4", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "140"]);
    node.ns.ip(&["-6", "route", "add", "local", "::/0", "dev", "lo", "table", "140"]);
}

/// flock's DNS server for `zone` in `ns` (a resolver pod), on port 53 of each of `ips`: one
/// server per address, since a UDP socket bound to every address would answer from the
/// route's preferred one, which a connected client does not take.
#[allow(clippy::panic)]
pub fn serve_dns(
    ns: crate::netns::Netns,
    ips: Vec<IpAddr>,
    zone: crate::sim::dns::Zone,
) -> (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>) {
    serve_in(ns, move |stop, ready| {
        Box::pin(async move {
            let zone = std::sync::Arc::new(zone);
            let mut servers = tokio::task::JoinSet::new();
            for ip in ips {
                let (udp, tcp) = match (tokio::net::UdpSocket::bind((ip, 53)).await, tokio::net::TcpListener::bind((ip, 53)).await) {
                    (Ok(u), Ok(t)) => (u, t),
                    (u, t) => panic!("binding DNS on {ip}: {:?} {:?}", u.err(), t.err()),
                };
                servers.spawn(crate::sim::dns::serve(zone.clone(), udp, tcp, stop.clone()));
            }
            let _ = ready.send(());
            while servers.join_next().await.is_some() {}
        })
    })
}

/// `proxy` serving in `ns` (the node's), its listeners bound before this returns.
#[allow(clippy::panic)]
pub fn serve_dns_proxy<L: crate::dns_proxy::proxy::Learner>(
    ns: crate::netns::Netns,
    proxy: crate::dns_proxy::proxy::DnsProxy<L>,
) -> (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>) {
    serve_in(ns, move |stop, ready| {
        Box::pin(async move {
            let listeners = match crate::dns_proxy::proxy::Listeners::bind(proxy.config()) {
                Ok(l) => l,
                Err(e) => panic!("{e}"),
            };
            let _ = ready.send(());
            proxy.serve(listeners, stop).await;
        })
    })
}

/// A running `flock-socket-keeper` (the binary at `bin`: integration tests pass
/// `env!("CARGO_BIN_EXE_flock-socket-keeper")`) in a PID namespace of its own, as in its own
/// pod, on a socket in a temporary directory; killed and removed on drop.
pub struct SocketKeeper {
    child: std::process::Child,
    socket: std::path::PathBuf,
    _dir: TempDir,
}

impl SocketKeeper {
    #[allow(clippy::panic)]
    pub fn start(bin: &str, tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let socket = dir.join("keeper.sock");
        let child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", bin, "--socket"])
            .arg(&socket)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        let keeper = Self { child, socket, _dir: dir };
        let start = std::time::Instant::now();
        while !keeper.socket.exists() {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "the socket keeper did not start");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        keeper
    }

    /// The agent's client of this keeper.
    pub fn client(&self) -> crate::dns_proxy::keeper::Keeper {
        crate::dns_proxy::keeper::Keeper::new(&self.socket)
    }

    /// A proxy's life before an agent restart, in `ns`: it binds the listeners of `config`,
    /// deposits them here, and is gone without reading a query.
    #[allow(clippy::panic)]
    pub fn hold_new_listeners(&self, ns: crate::netns::Netns, config: &crate::dns_proxy::proxy::ProxyConfig) {
        let (keeper, config) = (self.client(), config.clone());
        let (_stop, thread) = serve_in(ns, move |_, ready| {
            Box::pin(async move {
                let listeners = crate::dns_proxy::proxy::Listeners::bind(&config).unwrap_or_else(|e| panic!("binding the listeners: {e}"));
                let fds = listeners.fds().unwrap_or_else(|e| panic!("the listeners' descriptors: {e}"));
                let borrowed: Vec<_> = fds.iter().map(std::os::fd::AsFd::as_fd).collect();
                if let Err(e) = keeper.deposit(crate::dns_proxy::keeper::DNS_PROXY, &borrowed) {
                    panic!("depositing the listeners: {e}");
                }
                let _ = ready.send(());
            })
        });
        if thread.join().is_err() {
            panic!("the first proxy's thread panicked");
        }
    }

    /// The next agent's proxy, in `ns`: it takes the listeners held here and serves them.
    #[allow(clippy::panic)]
    pub fn serve_kept<L: crate::dns_proxy::proxy::Learner>(
        &self,
        ns: crate::netns::Netns,
        proxy: crate::dns_proxy::proxy::DnsProxy<L>,
    ) -> (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>) {
        let keeper = self.client();
        serve_in(ns, move |stop, ready| {
            Box::pin(async move {
                let kept = keeper.take(crate::dns_proxy::keeper::DNS_PROXY).unwrap_or_else(|e| panic!("taking the listeners: {e}"));
                let listeners = crate::dns_proxy::proxy::Listeners::adopt(proxy.config(), kept).unwrap_or_else(|e| panic!("{e}"));
                let _ = ready.send(());
                proxy.serve(listeners, stop).await;
            })
        })
    }
}

impl Drop for SocketKeeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
