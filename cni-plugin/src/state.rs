//! Attachment records: one small file per (network, container id, ifname), written when ADD
//! succeeds and removed by DEL. GC uses them to undo attachments the runtime no longer
//! lists — including releasing their IPAM leases, which flock-cni can only do knowing the
//! container id (delegates of spec < 1.1 have no GC of their own).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::protocol::PodIdentity;

/// Where records live unless the config says otherwise (persistent, next to libcni's cache).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/flock";

/// What ADD set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    pub host_interface: String,
    pub netns: String,
    pub ips: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodIdentity>,
}

/// The records directory of one network.
pub fn network_dir(state_dir: &Path, network: &str) -> PathBuf {
    state_dir.join(network)
}

fn file(dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    dir.join(format!("{container_id}-{ifname}.json"))
}

/// Writes a record atomically.
pub fn write(dir: &Path, r: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}-{}.tmp", r.container_id, r.ifname));
    std::fs::write(&tmp, serde_json::to_vec(r)?)?;
    std::fs::rename(&tmp, file(dir, &r.container_id, &r.ifname))
}

/// Removes a record; a missing one is fine.
pub fn remove(dir: &Path, container_id: &str, ifname: &str) -> std::io::Result<()> {
    match std::fs::remove_file(file(dir, container_id, ifname)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Every readable record of a network (unreadable files are skipped).
pub fn list(dir: &Path) -> std::io::Result<Vec<Record>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<Record> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| std::fs::read(&p).ok().and_then(|b| serde_json::from_slice(&b).ok()))
        .collect();
    out.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
    Ok(out)
}

/// Host interfaces recorded by any network under `state_dir`.
pub fn all_host_interfaces(state_dir: &Path) -> Vec<String> {
    let Ok(nets) = std::fs::read_dir(state_dir) else { return Vec::new() };
    nets.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .flat_map(|d| list(&d).unwrap_or_default())
        .map(|r| r.host_interface)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_list_remove() {
        let root = std::env::temp_dir().join(format!("flock-cni-state-{}", std::process::id()));
        let dir = network_dir(&root, "net");
        let r = Record {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            host_interface: crate::host_interface_name("c1", "eth0"),
            netns: "/run/netns/p".into(),
            ips: vec!["198.18.1.2".parse().unwrap()],
            pod: None,
        };
        write(&dir, &r).unwrap();
        std::fs::write(dir.join("junk.json"), "{").unwrap();
        assert_eq!(list(&dir).unwrap(), vec![r.clone()]);
        assert_eq!(all_host_interfaces(&root), vec![r.host_interface.clone()]);
        remove(&dir, "c1", "eth0").unwrap();
        remove(&dir, "c1", "eth0").unwrap();
        assert!(list(&dir).unwrap().is_empty());
        assert!(list(&root.join("none")).unwrap().is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }
}
