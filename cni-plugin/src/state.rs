//! Attachment records: one small file per (network, container id, ifname), written when ADD
//! succeeds and removed by DEL. GC uses them to undo attachments the runtime no longer
//! lists — including releasing their IPAM leases, which flock-cni can only do knowing the
//! container id (delegates of spec < 1.1 have no GC of their own). File names and the key
//! check are [`crate::attachment_file`]'s.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::attachment_file;
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

/// The key a record file holds.
fn key_of(bytes: &[u8]) -> Option<(String, String)> {
    serde_json::from_slice::<Record>(bytes).ok().map(|r| (r.container_id, r.ifname))
}

/// Writes a record atomically (refusing to replace another attachment's).
pub fn write(dir: &Path, r: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    attachment_file::write(dir, &r.container_id, &r.ifname, &serde_json::to_vec(r)?, key_of).map(|_| ())
}

/// Removes a record (under its current or its old name); a missing one is fine.
pub fn remove(dir: &Path, container_id: &str, ifname: &str) -> std::io::Result<()> {
    attachment_file::remove(dir, container_id, ifname, key_of)
}

/// Every readable record of a network, whatever its file's name (unreadable files are
/// skipped), one per attachment.
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
    // An old-named record left next to the current one of the same attachment.
    out.dedup_by(|a, b| a.container_id == b.container_id && a.ifname == b.ifname);
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
        let r = record("c1", "eth0");
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

    fn record(id: &str, ifname: &str) -> Record {
        Record {
            container_id: id.into(),
            ifname: ifname.into(),
            host_interface: crate::host_interface_name(id, ifname),
            netns: "/run/netns/p".into(),
            ips: vec!["198.18.1.2".parse().unwrap()],
            pod: None,
        }
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flock-cni-state-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn attachments_whose_old_names_collide_keep_their_own_records() {
        let dir = temp("collide");
        let (x, y) = (record("a-b", "c"), record("a", "b-c"));
        write(&dir, &x).unwrap();
        write(&dir, &y).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![y.clone(), x.clone()]);
        remove(&dir, "a", "b-c").unwrap();
        assert_eq!(list(&dir).unwrap(), vec![x]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_container_id_of_1024_characters_has_a_record() {
        let dir = temp("long");
        let r = record(&"c".repeat(1024), "eth0");
        write(&dir, &r).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![r.clone()]);
        remove(&dir, &r.container_id, "eth0").unwrap();
        assert!(list(&dir).unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn records_written_under_the_old_name_are_listed_and_removed() {
        let dir = temp("upgrade");
        std::fs::create_dir_all(&dir).unwrap();
        // What flock-cni wrote before: <container id>-<ifname>.json.
        let old = record("c1", "eth0");
        std::fs::write(dir.join("c1-eth0.json"), serde_json::to_vec(&old).unwrap()).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![old.clone()]);
        // One record per attachment even with both names present.
        write(&dir, &old).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![old]);
        remove(&dir, "c1", "eth0").unwrap();
        assert!(list(&dir).unwrap().is_empty());
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
