//! The files flock-cni keeps per attachment — attachment records ([`crate::state`]) and DELs
//! spooled for the agent ([`crate::protocol::spool_del`]) — and how they are named.
//!
//! A file is named `<SHA-256 of its key, 64 hex digits>.json`: 69 bytes whatever the length of
//! the container id (runtimes accept ids far beyond NAME_MAX), and distinct keys give distinct
//! names, because the key — (container id, ifname) — is hashed with the id's length in front.
//! The old `<container id>-<ifname>.json` gave `a-b`+`c` and `a`+`b-c` one file, and failed
//! for ids of more than about 240 bytes. Every file also holds its key, and a file is
//! overwritten or removed only after the key read from it matches, so a hash collision (or a
//! foreign file) is never taken for another attachment's.
//!
//! Upgrades: nothing is renamed. Readers list the directory and take each key from the
//! content, so files written under the old names are still read (the agent still drains an old
//! spooled DEL; GC still sees an old record), and [`remove`] also removes the old name of a
//! key when the file there holds that key.

use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The longest file name Linux accepts (bytes).
pub const NAME_MAX: usize = 255;

/// How to read the key a file of one kind holds (`None`: not a file of that kind).
pub type KeyOf = fn(&[u8]) -> Option<(String, String)>;

/// The file name of the attachment `(container_id, ifname)`.
pub fn file_name(container_id: &str, ifname: &str) -> String {
    format!("{}.json", key_hash(container_id, ifname))
}

/// The name flock-cni used before [`file_name`]: `<container id>-<ifname>.json` (ambiguous,
/// and too long for long ids). Only read and removed, never written.
pub fn legacy_file_name(container_id: &str, ifname: &str) -> String {
    format!("{container_id}-{ifname}.json")
}

fn key_hash(container_id: &str, ifname: &str) -> String {
    let id_len = u64::try_from(container_id.len()).unwrap_or(u64::MAX);
    let digest =
        Sha256::new().chain_update(id_len.to_be_bytes()).chain_update(container_id.as_bytes()).chain_update(ifname.as_bytes()).finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key held by the file at `path`: `None` when there is no file, `Some(None)` when it
/// holds no key of this kind.
fn stored_key(path: &Path, key_of: KeyOf) -> io::Result<Option<Option<(String, String)>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(key_of(&bytes))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn holds(found: &(String, String), container_id: &str, ifname: &str) -> bool {
    found.0 == container_id && found.1 == ifname
}

/// Writes `body` (which holds the key `(container_id, ifname)`) as that attachment's file in
/// `dir`, atomically: a temporary file, then rename. Refuses when the file there holds
/// another attachment's key.
pub fn write(dir: &Path, container_id: &str, ifname: &str, body: &[u8], key_of: KeyOf) -> io::Result<PathBuf> {
    let path = dir.join(file_name(container_id, ifname));
    if let Some(Some(found)) = stored_key(&path, key_of)?
        && !holds(&found, container_id, ifname)
    {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} holds attachment {}/{}, not {container_id}/{ifname}", path.display(), found.0, found.1),
        ));
    }
    // The pid keeps two processes writing the same key (never the runtime's intent) from
    // sharing a temporary file.
    let tmp = dir.join(format!(".{}.{}.tmp", key_hash(container_id, ifname), std::process::id()));
    let written = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| path)
}

/// Removes the file of `(container_id, ifname)` in `dir`, and a file under its old name that
/// holds the same key. A missing file is fine; a file holding another key is not this
/// attachment's and stays.
pub fn remove(dir: &Path, container_id: &str, ifname: &str, key_of: KeyOf) -> io::Result<()> {
    remove_if_ours(&dir.join(file_name(container_id, ifname)), container_id, ifname, key_of, true)?;
    let legacy = legacy_file_name(container_id, ifname);
    // flock-cni never wrote such a name (the write failed), and a '/' would leave `dir`.
    if legacy.len() <= NAME_MAX && !legacy.contains('/') {
        remove_if_ours(&dir.join(legacy), container_id, ifname, key_of, false)?;
    }
    Ok(())
}

/// Removes `path` when it holds the key; `keyless` says whether a file holding no key at all
/// (unreadable: nobody's record) goes too.
fn remove_if_ours(path: &Path, container_id: &str, ifname: &str, key_of: KeyOf, keyless: bool) -> io::Result<()> {
    let ours = match stored_key(path, key_of)? {
        None => return Ok(()),
        Some(Some(found)) => holds(&found, container_id, ifname),
        Some(None) => keyless,
    };
    if !ours {
        return Ok(());
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of the form `container id \n ifname`.
    fn key_of(b: &[u8]) -> Option<(String, String)> {
        let t = std::str::from_utf8(b).ok()?;
        let (id, ifname) = t.split_once('\n')?;
        Some((id.to_string(), ifname.to_string()))
    }

    fn body(id: &str, ifname: &str) -> Vec<u8> {
        format!("{id}\n{ifname}").into_bytes()
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flock-cni-afile-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_are_injective_and_short_whatever_the_id() {
        assert_ne!(file_name("a-b", "c"), file_name("a", "b-c"));
        assert_eq!(legacy_file_name("a-b", "c"), legacy_file_name("a", "b-c"), "the collision the new names remove");
        assert_ne!(file_name("ab", "c"), file_name("a", "bc"));
        let long = "x".repeat(1024);
        let n = file_name(&long, "eth0");
        assert_eq!(n.len(), 69, "{n}");
        assert!(n.len() <= NAME_MAX);
        assert_eq!(n, file_name(&long, "eth0"));
        assert_ne!(n, file_name(&long, "eth1"));
        // A new name never looks like an old one: old names always contain '-'.
        assert!(!n.contains('-'));
    }

    #[test]
    fn write_refuses_a_file_holding_another_key_and_remove_leaves_it() {
        let dir = temp("collide");
        // Plant another attachment's content under a's name, as a hash collision would.
        std::fs::write(dir.join(file_name("a", "eth0")), body("other", "eth0")).unwrap();
        let e = write(&dir, "a", "eth0", &body("a", "eth0"), key_of).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("other/eth0"), "{e}");
        remove(&dir, "a", "eth0", key_of).unwrap();
        assert_eq!(std::fs::read(dir.join(file_name("a", "eth0"))).unwrap(), body("other", "eth0"));
        // Its own file is replaced and removed; no temporary file stays.
        let p = write(&dir, "b", "eth0", &body("b", "eth0"), key_of).unwrap();
        write(&dir, "b", "eth0", &body("b", "eth0"), key_of).unwrap();
        remove(&dir, "b", "eth0", key_of).unwrap();
        assert!(!p.exists());
        remove(&dir, "b", "eth0", key_of).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn remove_takes_an_old_name_only_when_it_holds_the_key() {
        let dir = temp("legacy");
        // The old name a-b-c.json is shared by (a-b, c) and (a, b-c); it holds (a-b, c).
        let old = dir.join(legacy_file_name("a-b", "c"));
        std::fs::write(&old, body("a-b", "c")).unwrap();
        remove(&dir, "a", "b-c", key_of).unwrap();
        assert!(old.exists(), "another attachment's old file was removed");
        remove(&dir, "a-b", "c", key_of).unwrap();
        assert!(!old.exists());
        // An old file that holds no key is nobody's: left alone under the shared old name.
        std::fs::write(&old, "garbage").unwrap();
        remove(&dir, "a-b", "c", key_of).unwrap();
        assert!(old.exists());
        // Ids too long for an old name are fine.
        remove(&dir, &"x".repeat(1024), "eth0", key_of).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
