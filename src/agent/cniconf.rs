//! The CNI network configuration flock-agent writes for kubelet's runtime, like Cilium: only
//! once the agent is ready (so the node does not report its network ready before flock can
//! program pods), with this node's pod CIDRs as host-local ranges, rewritten when they
//! change. It writes one file of its own and removes nothing else. The plugin gets the
//! agent's socket and DEL spool directory from it, so both sides always agree on them.
//! Pods' `hostPort`s are the reference `portmap` plugin's, chained after flock-cni when it is
//! on the node (as Calico's and Cilium's charts chain it): its DNAT runs before flock's table,
//! which judges the pod address it chose.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde_json::json;

/// How pods' `hostPort`s are served (`--cni-host-ports`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPorts {
    /// Chain `portmap` when the plugin is in this directory (the node's CNI binaries).
    Auto(PathBuf),
    On,
    Off,
}

impl HostPorts {
    /// Whether the conflist chains `portmap`, now.
    pub(crate) fn enabled(&self) -> bool {
        match self {
            Self::On => true,
            Self::Off => false,
            Self::Auto(dir) => dir.join("portmap").is_file(),
        }
    }
}

/// The conflist content for `pod_cidrs`.
pub(crate) fn render(name: &str, pod_cidrs: &[IpNet], socket: &Path, pending_del_dir: &Path, mtu: Option<u32>, host_ports: bool) -> String {
    let ranges: Vec<serde_json::Value> = pod_cidrs.iter().map(|c| json!([{"subnet": c.to_string()}])).collect();
    let mut plugin = json!({
        "type": "flock-cni",
        "agentSocket": socket,
        // Where the agent drains DELs at start (`--pending-del-dir`): a plugin spooling
        // elsewhere would lose them.
        "pendingDelDir": pending_del_dir,
        "capabilities": {"ips": true},
        "ipam": {"type": "host-local", "ranges": ranges}
    });
    if let Some(m) = mtu {
        plugin["mtu"] = json!(m);
    }
    let mut plugins = vec![json!({"type": "loopback"}), plugin];
    if host_ports {
        // The runtime passes a pod's hostPorts as runtimeConfig.portMappings only to a
        // plugin with this capability; a pod without any costs portmap nothing.
        plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
    }
    let conf = json!({
        // Debian's and most distributions' delegated plugins stop at spec 1.0.0.
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": plugins
    });
    serde_json::to_string_pretty(&conf).unwrap_or_default() + "\n"
}

/// Writes the conflist when its content changes (atomically: a temporary file, then
/// rename).
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) path: PathBuf,
    pub(crate) network: String,
    pub(crate) socket: PathBuf,
    pub(crate) pending_del_dir: PathBuf,
    pub(crate) mtu: Option<u32>,
    pub(crate) host_ports: HostPorts,
    last: Option<String>,
}

impl Writer {
    pub(crate) fn new(dir: &Path, file: &str, socket: PathBuf, pending_del_dir: PathBuf, mtu: Option<u32>, host_ports: HostPorts) -> Self {
        Self { path: dir.join(file), network: "flock".into(), socket, pending_del_dir, mtu, host_ports, last: None }
    }

    /// Writes the config for `pod_cidrs`; `Ok(true)` when the file changed. Nothing is
    /// written without a pod CIDR (IPAM would have nothing to allocate from).
    pub(crate) fn write(&mut self, pod_cidrs: &[IpNet]) -> std::io::Result<bool> {
        if pod_cidrs.is_empty() {
            return Ok(false);
        }
        let text = render(&self.network, pod_cidrs, &self.socket, &self.pending_del_dir, self.mtu, self.host_ports.enabled());
        if self.last.as_deref() == Some(text.as_str()) && self.path.exists() {
            return Ok(false);
        }
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp-flock");
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, &self.path)?;
        self.last = Some(text);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_once_per_change_and_valid_for_the_plugin() {
        let dir = std::env::temp_dir().join(format!("flock-cniconf-{}", std::process::id()));
        let mut w = Writer::new(
            &dir,
            "10-flock.conflist",
            PathBuf::from("/run/flock/cni.sock"),
            PathBuf::from("/var/spool/flock-del"),
            Some(1450),
            HostPorts::Off,
        );
        assert!(!w.write(&[]).unwrap());
        assert!(!w.path.exists());
        let cidrs: Vec<IpNet> = vec!["198.18.1.0/24".parse().unwrap(), "2001:db8:1::/64".parse().unwrap()];
        assert!(w.write(&cidrs).unwrap());
        assert!(!w.write(&cidrs).unwrap());
        let list = flock_cni::runtime::ConfList::load(&w.path).unwrap();
        assert_eq!(list.plugins.len(), 2);
        let ranges = &list.plugins[1]["ipam"]["ranges"];
        assert_eq!(ranges[1][0]["subnet"], "2001:db8:1::/64");
        // The plugin, as the runtime calls it, reads the agent's socket and spool directory.
        let mut plugin = list.plugins[1].clone();
        plugin.insert("cniVersion".into(), list.cni_version.clone().into());
        plugin.insert("name".into(), list.name.clone().into());
        let (conf, _) = flock_cni::spec::parse_conf(&serde_json::to_vec(&plugin).unwrap()).unwrap();
        assert_eq!(conf.agent_socket.as_deref(), Some(Path::new("/run/flock/cni.sock")));
        assert_eq!(conf.pending_del_dir.as_deref(), Some(Path::new("/var/spool/flock-del")));
        // Unrelated files in the directory are left alone.
        std::fs::write(dir.join("99-other.conflist"), "{}").unwrap();
        assert!(w.write(&cidrs[..1]).unwrap());
        assert!(dir.join("99-other.conflist").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// hostPorts: `portmap` chained after flock-cni, with the capability the runtime passes
    /// the pod's ports to; `auto` chains it only when the node has the plugin.
    #[test]
    fn portmap_is_chained_when_the_node_has_it() {
        let dir = std::env::temp_dir().join(format!("flock-cniconf-pm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cidrs: Vec<IpNet> = vec!["198.18.1.0/24".parse().unwrap()];
        let types = |text: &str| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            v["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap().to_string()).collect()
        };
        let auto = HostPorts::Auto(dir.clone());
        assert!(!auto.enabled());
        let text = render("flock", &cidrs, Path::new("/s"), Path::new("/d"), None, auto.enabled());
        assert_eq!(types(&text), ["loopback", "flock-cni"]);
        std::fs::write(dir.join("portmap"), "").unwrap();
        assert!(auto.enabled());
        let text = render("flock", &cidrs, Path::new("/s"), Path::new("/d"), None, auto.enabled());
        assert_eq!(types(&text), ["loopback", "flock-cni", "portmap"]);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["plugins"][2]["capabilities"]["portMappings"], true);
        assert!(HostPorts::On.enabled() && !HostPorts::Off.enabled());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
