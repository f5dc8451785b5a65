//! The real backend, in a given network namespace: transactions as nf_tables netlink batches
//! ([`super::netlink`]) on a socket kept open, and the `nft` command for what those do not
//! encode and for listings.
//!
//! Scripts go to `nft -f -` on stdin (one atomic transaction per call); listings come from
//! netlink dumps (for drift comparison, [`super::netlink::dump`]; `nft -j -s list table inet
//! flock` when transactions go through nft), `nft -s list table inet flock` (text, for
//! operators' tools) and `list chains/sets/maps` in terse JSON (read with the `nftables` crate's schema types, for object names and
//! handles). Errors carry nft's own message.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use nftables::schema::Chain;

use super::netlink::{NetlinkError, NfSocket};
use super::{ApplyError, Backend, ObjectInfo};
use crate::netns::{self, Netns};
use crate::nft::parse::Kind;
use crate::render::names::{FAMILY, TABLE};

/// `nft`, run in one network namespace, and the netfilter socket element batches go through.
#[derive(Debug)]
pub struct NftCli {
    netns: Netns,
    program: PathBuf,
    /// Kept open between batches (see [`NfSocket`] for why); `None` until the first one, and
    /// after a batch failed.
    socket: Option<NfSocket>,
    /// Whether transactions go as netlink batches (else every one through `nft`).
    netlink: bool,
}

/// A clone runs the same `nft` in the same namespace, with a socket of its own.
impl Clone for NftCli {
    fn clone(&self) -> Self {
        Self { netns: self.netns.clone(), program: self.program.clone(), socket: None, netlink: self.netlink }
    }
}

impl NftCli {
    pub fn new(netns: Netns) -> Self {
        Self { netns, program: PathBuf::from("nft"), socket: None, netlink: true }
    }

    /// Uses another `nft` binary (e.g. an absolute path in a container image).
    pub fn with_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// Sends transactions as netlink batches (the default), or every one through `nft`.
    pub fn with_netlink(mut self, on: bool) -> Self {
        self.netlink = on;
        self
    }

    fn exec(&self, args: &[&str], stdin: Option<&str>) -> Result<Output, ApplyError> {
        let program = self.program.clone();
        let spawn_err = |error| ApplyError::Spawn { netns: self.netns.describe(), error };
        netns::run_in(&self.netns, move || -> std::io::Result<Output> {
            let mut cmd = Command::new(&program);
            cmd.args(args)
                .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn()?;
            if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
                // An nft that exits before reading its script (it failed at once) closes the
                // pipe: its exit status and stderr say why, not the broken pipe.
                match pipe.write_all(text.as_bytes()) {
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                    other => other?,
                }
            }
            child.wait_with_output()
        })?
        .map_err(spawn_err)
    }

    fn run_script(&self, script: &str, check: bool) -> Result<(), ApplyError> {
        let args: &[&str] = if check { &["-c", "-f", "-"] } else { &["-f", "-"] };
        let out = self.exec(args, Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        Err(ApplyError::Rejected {
            context: format!("nft {} in {}", args.join(" "), self.netns.describe()),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    /// Checks, before anything is programmed, that `nft` runs here and understands the
    /// rules flock writes: the binary answers `--version`, and `sample` (a ruleset rendered by
    /// flock) passes `nft -c`. A missing or too old nft then fails the start with one clear
    /// message instead of every sync. Returns nft's version line.
    pub(crate) fn probe(&self, sample: &str) -> Result<String, ApplyError> {
        let out = self.exec(&["--version"], None)?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            return Err(ApplyError::Rejected {
                context: format!("{} --version", self.program.display()),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        self.run_script(sample, true).map_err(|e| match e {
            ApplyError::Rejected { message, .. } => ApplyError::Rejected {
                context: format!("{version} cannot load the rules flock writes; flock needs nftables 1.0 or later"),
                message,
            },
            other => other,
        })?;
        Ok(version)
    }
}

impl NftCli {
    /// Commits `encoded` as one netlink batch; when nothing reached the kernel (the change
    /// holds something the encoder does not know, no socket opens), the same transaction as
    /// `script` through nft.
    fn batch_or_nft(
        &mut self,
        what: &str,
        encoded: Result<super::netlink::Batch, NetlinkError>,
        script: impl FnOnce() -> String,
    ) -> Result<(), ApplyError> {
        if !self.netlink {
            return self.run(&script());
        }
        let sent = match encoded {
            Ok(batch) => self.netlink_send(batch)?,
            Err(e) => Err(e),
        };
        match sent {
            Ok(()) => Ok(()),
            Err(e) if e.is_unsent() => {
                tracing::debug!(error = %e, "{what} through nft");
                self.run(&script())
            }
            Err(e) => Err(ApplyError::Rejected { context: format!("netlink {what} in {}", self.netns.describe()), message: e.to_string() }),
        }
    }

    /// Sends `batch` on the kept socket ([`Self::with_socket`]).
    fn netlink_send(&mut self, batch: super::netlink::Batch) -> Result<Result<(), NetlinkError>, ApplyError> {
        self.with_socket(|s| s.send(batch))
    }

    /// Runs `f` on the kept socket, first opening one in the namespace when there is none or
    /// the namespace is no longer the one the socket was opened in (a path may come to name
    /// another namespace; the current namespace is the calling thread's). A failure may leave
    /// replies behind: the socket is kept only after a success.
    fn with_socket<T: Send>(
        &mut self,
        f: impl FnOnce(&mut NfSocket) -> Result<T, NetlinkError> + Send,
    ) -> Result<Result<T, NetlinkError>, ApplyError> {
        let here = match &self.netns {
            Netns::Current => netns::identity(Path::new(netns::OWN_NETNS)),
            Netns::Path(path) => netns::identity(path),
            Netns::Fresh => {
                return Ok(netns::run_in(&self.netns, || NfSocket::open().and_then(|mut s| f(&mut s)))?);
            }
        };
        let here = match here {
            Ok(id) => id,
            Err(e) => return Ok(Err(NetlinkError::Socket(std::io::Error::other(e)))),
        };
        let mut socket = match self.socket.take() {
            Some(s) if s.is_in(here) => s,
            _ => match netns::run_in(&self.netns, NfSocket::open)? {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            },
        };
        let result = f(&mut socket);
        if result.is_ok() {
            self.socket = Some(socket);
        }
        Ok(result)
    }
}

/// nft's message when the listed table does not exist.
fn is_missing_table(stderr: &str) -> bool {
    stderr.contains("No such file or directory")
}

impl Backend for NftCli {
    /// A netlink batch ([`super::netlink`]); through `nft` when it cannot be sent that way.
    fn write_elements(&mut self, changes: &[super::ElementChange<'_>]) -> Result<(), ApplyError> {
        self.batch_or_nft("element update", super::netlink::encode_batch(changes), || super::element_script(changes))
    }

    /// A netlink batch ([`super::netlink::transaction`]); through `nft` when it cannot be sent
    /// that way.
    fn write_full(
        &mut self,
        rs: &crate::render::Ruleset,
        existing: &std::collections::BTreeSet<(Kind, String)>,
        text: &str,
    ) -> Result<(), ApplyError> {
        self.batch_or_nft("full sync", super::netlink::transaction::encode_full(rs, existing), || {
            if existing.is_empty() { text.to_string() } else { super::transaction(rs, existing, text) }
        })
    }

    /// A netlink batch ([`super::netlink::transaction`]); through `nft` when it cannot be sent
    /// that way.
    fn write_steps(&mut self, steps: &[super::Step<'_>], next: &crate::render::Ruleset) -> Result<(), ApplyError> {
        self.batch_or_nft("incremental transaction", super::netlink::transaction::encode_steps(steps, next), || super::steps_script(steps))
    }

    fn run(&mut self, script: &str) -> Result<(), ApplyError> {
        self.run_script(script, false)
    }

    fn check(&mut self, script: &str) -> Result<(), ApplyError> {
        self.run_script(script, true)
    }

    fn list_table(&mut self) -> Result<Option<String>, ApplyError> {
        let out = self.exec(&["-s", "list", "table", FAMILY, TABLE], None)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return if is_missing_table(&stderr) { Ok(None) } else { Err(ApplyError::List(stderr.trim().to_string())) };
        }
        String::from_utf8(out.stdout).map(Some).map_err(|e| ApplyError::List(e.to_string()))
    }

    /// Over netlink ([`super::netlink::dump`]: timed sets' elements are not read), or from
    /// `nft -j` when transactions go through nft.
    fn read_state(&mut self) -> Result<Option<super::state::TableState>, ApplyError> {
        if self.netlink {
            let read = self.with_socket(NfSocket::read_table)?;
            return read
                .map(|s| s.map(super::state::TableState::Netlink))
                .map_err(|e| ApplyError::List(format!("over netlink in {}: {e}", self.netns.describe())));
        }
        let out = self.exec(&["-j", "-s", "list", "table", FAMILY, TABLE], None)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return if is_missing_table(&stderr) { Ok(None) } else { Err(ApplyError::List(stderr.trim().to_string())) };
        }
        super::state::TableState::from_json(&out.stdout).map(Some)
    }

    fn generation(&mut self) -> Result<Option<super::state::Generation>, ApplyError> {
        if !self.netlink {
            return Ok(None);
        }
        let read = self.with_socket(NfSocket::generation)?;
        read.map(Some).map_err(|e| ApplyError::List(format!("the ruleset generation in {}: {e}", self.netns.describe())))
    }

    fn list_objects(&mut self) -> Result<Vec<ObjectInfo>, ApplyError> {
        // Three object listings in one nft run: unlike `list table`, they do not make nft
        // fetch every rule and set element (10 ms instead of 97 ms for a 150k-pod cluster's
        // table). They cover the whole family; `parse_objects` keeps flock's table. (On the
        // command line: with `-j`, `-f -` would be read as JSON input.)
        let script = format!("list chains {FAMILY}; list sets {FAMILY}; list maps {FAMILY}");
        let out = self.exec(&["-j", "-t", &script], None)?;
        if !out.status.success() {
            return Err(ApplyError::List(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        parse_objects(&out.stdout)
    }
}

/// Object names, kinds and handles of table `inet flock` from `nft -j -t` listings: one
/// JSON document, or several in a row (one per listing command).
///
/// Chains are read with the `nftables` crate's schema types. Sets and maps are read by hand,
/// their name, table and handle only: crate 0.6.3 has no `verdict` data type (flock's
/// dispatch maps) and no `integer` key type, which nft gives a set keyed by a raw payload
/// (the overlay's `ip saddr . @th,336,32`: `["ipv4_addr", "integer"]`) — a restarted agent
/// could not read its own table, and its every sync failed. One unreadable object must not
/// hide the others, so each object is decoded on its own.
pub(crate) fn parse_objects(json: &[u8]) -> Result<Vec<ObjectInfo>, ApplyError> {
    #[derive(serde::Deserialize)]
    struct Listing {
        nftables: Vec<serde_json::Value>,
    }
    let bad = |e: String| ApplyError::List(format!("unexpected JSON from nft: {e}"));
    let mut objects = Vec::new();
    for doc in serde_json::Deserializer::from_slice(json).into_iter::<Listing>() {
        objects.extend(doc.map_err(|e| bad(e.to_string()))?.nftables);
    }
    let mut out = Vec::new();
    for obj in objects {
        if let Some(c) = obj.get("chain") {
            let c: Chain<'_> = serde_json::from_value(c.clone()).map_err(|e| bad(format!("chain: {e}")))?;
            if c.table == TABLE {
                out.push(ObjectInfo { kind: Kind::Chain, name: c.name.to_string(), handle: c.handle.map_or(0, u64::from) });
            }
        } else {
            for (key, kind) in [("set", Kind::Set), ("map", Kind::Map)] {
                let Some(m) = obj.get(key) else { continue };
                let field = |k: &str| m.get(k).and_then(serde_json::Value::as_str);
                let name = field("name").ok_or_else(|| bad(format!("{key} without a name")))?;
                if field("table") == Some(TABLE) {
                    let handle = m.get("handle").and_then(serde_json::Value::as_u64).unwrap_or(0);
                    out.push(ObjectInfo { kind, name: name.to_string(), handle });
                }
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_terse_json_listing() {
        // Captured from nft 1.0.6: `nft -j -t list table inet flock`.
        let json = br#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "flock", "handle": 1}}, {"set": {"family": "inet", "name": "pod-addrs-v4", "table": "flock", "type": ["ifname", "ipv4_addr"], "handle": 3, "comment": "c"}}, {"set": {"family": "inet", "name": "overlay-v4-in-v4", "table": "flock", "type": ["ipv4_addr", "integer"], "handle": 9, "comment": "c", "flags": ["interval"]}}, {"set": {"family": "ip", "name": "other", "table": "kube-proxy", "type": "ipv4_addr", "handle": 4}}, {"map": {"family": "inet", "name": "ingress-chains", "table": "flock", "type": "ifname", "handle": 6, "comment": "c", "map": "verdict"}}, {"chain": {"family": "inet", "table": "flock", "name": "ingress-ABCD1234-x/a", "handle": 1}}, {"chain": {"family": "inet", "table": "flock", "name": "forward", "handle": 2, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"rule": {"family": "inet", "table": "flock", "chain": "forward", "handle": 17, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}}]}"#;
        let objs = parse_objects(json).unwrap();
        let names: Vec<(Kind, &str, u64)> = objs.iter().map(|o| (o.kind, o.name.as_str(), o.handle)).collect();
        assert_eq!(
            names,
            vec![
                (Kind::Chain, "forward", 2),
                (Kind::Chain, "ingress-ABCD1234-x/a", 1),
                (Kind::Set, "overlay-v4-in-v4", 9),
                (Kind::Set, "pod-addrs-v4", 3),
                (Kind::Map, "ingress-chains", 6),
            ]
        );
        assert!(parse_objects(b"not json").is_err());
    }

    #[test]
    fn parses_one_document_per_listing_and_keeps_only_flocks_table() {
        // Captured from nft 1.0.6: `nft -j -t 'list chains inet; list sets inet; list maps inet'`.
        let json = br#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"chain": {"family": "inet", "table": "flock", "name": "forward", "handle": 223, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"chain": {"family": "inet", "table": "host", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}]}
{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"set": {"family": "inet", "name": "pod-addrs-v4", "table": "flock", "type": ["ifname", "ipv4_addr"], "handle": 3, "comment": "c"}}]}
{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}]}
"#;
        let objs = parse_objects(json).unwrap();
        let names: Vec<(Kind, &str)> = objs.iter().map(|o| (o.kind, o.name.as_str())).collect();
        assert_eq!(names, vec![(Kind::Chain, "forward"), (Kind::Set, "pod-addrs-v4")]);
        assert!(parse_objects(b"{\"nftables\": []}\n{broken").is_err());
    }
}
