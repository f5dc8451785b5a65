//! What is left of flock on a node after it was removed, and the DEL that removes it.
//!
//! When flock is removed (flock-agent saw its DaemonSet or namespace deleted), the agent takes
//! its table, routes and devices away at once. The CNI config and this plugin must stay while
//! the node still has pods flock-cni wired: the runtime tears those down through this config,
//! and without it their DEL would fail for ever. So the agent marks the config instead
//! (`agentRemoved` in flock-cni's plugin object, [`KEY`]); from then on ADD fails at once, and
//! the DEL that detaches the node's last flock pod removes what is left: the config, this
//! plugin, the DEL spool, the attachment records' directory and the agent's state files.
//!
//! The mark names what to remove, and each path is checked before anything goes: the config
//! only when it is flock's (a flock-cni plugin of this network carrying the same mark), the
//! binary only when it is the very file running now, and in the directories only the files
//! flock writes (then the directory, when that left it empty).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::runtime::ConfList;
use crate::spec::NetConf;
use crate::state;

/// The key of the mark in flock-cni's plugin object.
pub const KEY: &str = "agentRemoved";

/// The agent's state files flock-cni may remove from the agent's state directory.
pub const AGENT_STATE_FILES: [&str; 4] = ["endpoints.json", ".endpoints.json.tmp", "dns-resolvers", "agent.lock"];

/// The mark: flock was removed from this node; what to remove once its last pod is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Removed {
    /// The conflist the agent wrote (and marked).
    pub conflist: PathBuf,
    /// This plugin's binary on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<PathBuf>,
    /// The agent's state directory (its endpoint registry and node lock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_state_dir: Option<PathBuf>,
}

/// What [`finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// Pods flock-cni wired are still attached: nothing removed.
    PodsLeft(usize),
    /// The node's last flock pod is gone: these paths were removed.
    Removed(Vec<PathBuf>),
}

/// The paths of one network's flock-cni state: records, spool and agent socket.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The network's records directory ([`state::network_dir`]).
    pub records: PathBuf,
    pub spool: PathBuf,
    pub socket: PathBuf,
}

/// After a DEL under a marked config: when no attachment record is left, removes what the
/// mark names (each checked) and flock-cni's own state.
pub fn finish(conf: &NetConf, removed: &Removed, paths: &Paths) -> io::Result<Finished> {
    let left = state::list(&paths.records)?.len();
    if left > 0 {
        return Ok(Finished::PodsLeft(left));
    }
    let mut gone = Vec::new();
    match is_flocks_marked_conflist(&removed.conflist, &conf.name, removed) {
        Ok(true) => remove_file(&removed.conflist, &mut gone)?,
        Ok(false) => tracing::warn!(path = %removed.conflist.display(), "not flock's marked config: left in place"),
        Err(e) => tracing::warn!(path = %removed.conflist.display(), error = %e, "the marked config cannot be read: left in place"),
    }
    if let Some(bin) = &removed.binary {
        if is_running_binary(bin) {
            remove_file(bin, &mut gone)?;
        } else {
            tracing::warn!(path = %bin.display(), "not the running flock-cni binary: left in place");
        }
    }
    for (path, _) in crate::protocol::read_spool(&paths.spool)? {
        remove_file(&path, &mut gone)?;
    }
    remove_empty_dir(&paths.spool, &mut gone)?;
    if is_socket(&paths.socket) {
        remove_file(&paths.socket, &mut gone)?;
    }
    remove_empty_dir(&paths.records, &mut gone)?;
    if let Some(parent) = paths.records.parent() {
        remove_empty_dir(parent, &mut gone)?;
    }
    if let Some(dir) = &removed.agent_state_dir {
        for f in AGENT_STATE_FILES {
            remove_file(&dir.join(f), &mut gone)?;
        }
        remove_empty_dir(dir, &mut gone)?;
    }
    Ok(Finished::Removed(gone))
}

/// Whether `path` holds a conflist of network `network` whose flock-cni plugin carries
/// exactly `mark`.
fn is_flocks_marked_conflist(path: &Path, network: &str, mark: &Removed) -> Result<bool, String> {
    let list = ConfList::load(path)?;
    if list.name != network {
        return Ok(false);
    }
    Ok(list.plugins.iter().any(|p| {
        p.get("type").and_then(serde_json::Value::as_str) == Some("flock-cni")
            && p.get(KEY).and_then(|v| serde_json::from_value::<Removed>(v.clone()).ok()).as_ref() == Some(mark)
    }))
}

/// Whether `path` is the file this process runs from (same device and inode) and is named
/// flock-cni.
fn is_running_binary(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    if path.file_name().is_none_or(|n| n != "flock-cni") {
        return false;
    }
    let (Ok(exe), Ok(named)) = (std::fs::metadata("/proc/self/exe"), std::fs::metadata(path)) else { return false };
    exe.dev() == named.dev() && exe.ino() == named.ino()
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

fn remove_file(path: &Path, gone: &mut Vec<PathBuf>) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            gone.push(path.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("removing {}: {e}", path.display()))),
    }
}

/// Removes `dir` when it is empty (a directory something else also uses stays).
fn remove_empty_dir(dir: &Path, gone: &mut Vec<PathBuf>) -> io::Result<()> {
    match std::fs::remove_dir(dir) {
        Ok(()) => {
            gone.push(dir.to_path_buf());
            Ok(())
        }
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("removing {}: {e}", dir.display()))),
    }
}

/// The conflist `text` with `mark` set on its flock-cni plugin (`None`: it has none).
pub fn mark(text: &str, mark: &Removed) -> Option<String> {
    let mut v: serde_json::Value = serde_json::from_str(text).ok()?;
    let plugins = v.get_mut("plugins")?.as_array_mut()?;
    let plugin = plugins.iter_mut().find(|p| p.get("type").and_then(serde_json::Value::as_str) == Some("flock-cni"))?;
    plugin.as_object_mut()?.insert(KEY.into(), serde_json::to_value(mark).ok()?);
    serde_json::to_string_pretty(&v).ok().map(|s| s + "\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn conflist(name: &str, mark: Option<&Removed>) -> String {
        let mut plugin = serde_json::json!({"type": "flock-cni", "ipam": {"type": "host-local"}});
        if let Some(m) = mark {
            plugin[KEY] = serde_json::to_value(m).unwrap();
        }
        serde_json::json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "loopback"}, plugin]}).to_string()
    }

    #[test]
    fn only_flocks_marked_config_is_taken_for_it() {
        let dir = std::env::temp_dir().join(format!("flock-cni-removal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("10-flock.conflist");
        let m = Removed { conflist: path.clone(), binary: None, agent_state_dir: None };
        std::fs::write(&path, conflist("flock", Some(&m))).unwrap();
        assert_eq!(is_flocks_marked_conflist(&path, "flock", &m), Ok(true));
        // Another network's name, no mark, another mark: not flock's to remove.
        assert_eq!(is_flocks_marked_conflist(&path, "other", &m), Ok(false));
        std::fs::write(&path, conflist("flock", None)).unwrap();
        assert_eq!(is_flocks_marked_conflist(&path, "flock", &m), Ok(false));
        let other = Removed { conflist: dir.join("99-other.conflist"), ..m.clone() };
        std::fs::write(&path, conflist("flock", Some(&other))).unwrap();
        assert_eq!(is_flocks_marked_conflist(&path, "flock", &m), Ok(false));
        // mark() sets it on the flock-cni plugin alone, and reads back.
        let marked = mark(&conflist("flock", None), &m).unwrap();
        std::fs::write(&path, &marked).unwrap();
        assert_eq!(is_flocks_marked_conflist(&path, "flock", &m), Ok(true));
        let v: serde_json::Value = serde_json::from_str(&marked).unwrap();
        assert!(v["plugins"][0].get(KEY).is_none());
        assert_eq!(mark(r#"{"plugins": [{"type": "ptp"}]}"#, &m), None);
        assert!(!is_running_binary(&path));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
