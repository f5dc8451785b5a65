//! The CNI network configuration flock-agent writes for kubelet's runtime, like Cilium: only
//! once the agent is ready (so the node does not report its network ready before flock can
//! program pods), with this node's pod CIDRs as host-local ranges, rewritten when they
//! change. It writes one file of its own and removes nothing else. The plugin gets the
//! agent's socket and DEL spool directory from it, so both sides always agree on them.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde_json::json;

/// The conflist content for `pod_cidrs`.
pub(crate) fn render(name: &str, pod_cidrs: &[IpNet], socket: &Path, pending_del_dir: &Path, mtu: Option<u32>) -> String {
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
    let conf = json!({
        // Debian's and most distributions' delegated plugins stop at spec 1.0.0.
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{"type": "loopback"}, plugin]
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
    last: Option<String>,
}

impl Writer {
    pub(crate) fn new(dir: &Path, file: &str, socket: PathBuf, pending_del_dir: PathBuf, mtu: Option<u32>) -> Self {
        Self { path: dir.join(file), network: "flock".into(), socket, pending_del_dir, mtu, last: None }
    }

    /// Writes the config for `pod_cidrs`; `Ok(true)` when the file changed. Nothing is
    /// written without a pod CIDR (IPAM would have nothing to allocate from).
    pub(crate) fn write(&mut self, pod_cidrs: &[IpNet]) -> std::io::Result<bool> {
        if pod_cidrs.is_empty() {
            return Ok(false);
        }
        let text = render(&self.network, pod_cidrs, &self.socket, &self.pending_del_dir, self.mtu);
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
        let mut w =
            Writer::new(&dir, "10-flock.conflist", PathBuf::from("/run/flock/cni.sock"), PathBuf::from("/var/spool/flock-del"), Some(1450));
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
}
