//! Reading table `inet flock` back over netlink, for the drift check: its chains, rules, sets
//! and maps as the kernel reports them, and the elements of every set except the timed ones.
//!
//! A timed set's elements are what the DNS proxy learned (and their countdowns), written
//! between flock's transactions: not drift, so they are not even read — a pod that makes the
//! proxy learn 16,384 addresses cannot make every drift check read them. `nft -j list table`
//! reads every element of every set and formats them as JSON for flock to parse again
//! (seconds at 150k pods); this asks the kernel only for what it compares.
//!
//! Objects are kept as their attributes, less what the kernel assigns or counts rather than
//! what flock wrote: handles, ids, positions, use counts, chain counters and the state of
//! stateful expressions (a rule's `counter` values). Comparing two reads compares what flock
//! wrote; the kernel's own bytes mean nothing formats them differently across nft versions.
//!
//! Anonymous sets (a rule's `{ 80, 443 }`) are read with their elements too: the kernel
//! names them `__set<n>`, reusing the lowest free number, so a rule replaced by one with
//! other ports can carry the same bytes and set name.
//!
//! Each read starts with the ruleset's generation (`NFT_MSG_GETGEN`) and the namespace's
//! identity: every committed transaction, anyone's, bumps the generation, so the same
//! generation in the same namespace as the one read before a baseline proves the table
//! unchanged since without reading it ([`super::super::Applier::check_drift`]). A read that a
//! transaction tore (a dump flagged interrupted, a set or chain gone or new between two
//! dumps) is read again.

use std::collections::BTreeMap;

use super::{NFNL_SUBSYS_NFTABLES, NFPROTO_INET, NFTA_LIST_ELEM, NetlinkError, NfSocket, attr, message, messages, nul_terminated};
use crate::apply::state::{Generation, NetlinkObject, NetlinkState};
use crate::nfnetlink::{NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attributes as attrs, nested, raw_attributes as raw_attrs};
use crate::nft::parse::Kind;
use crate::render::names::TABLE;

const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFT_MSG_NEWTABLE: u16 = 0;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_USE: u16 = 3;
const NFTA_TABLE_HANDLE: u16 = 4;
const NFTA_TABLE_OWNER: u16 = 7;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_HANDLE: u16 = 2;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_USE: u16 = 6;
const NFTA_CHAIN_COUNTERS: u16 = 8;
const NFTA_CHAIN_ID: u16 = 11;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_POSITION: u16 = 6;
const NFTA_RULE_ID: u16 = 9;
const NFTA_RULE_POSITION_ID: u16 = 10;
const NFTA_RULE_CHAIN_ID: u16 = 11;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_HANDLE: u16 = 16;
/// The number of elements (kernels since 6.16): counted by the kernel; the elements are compared.
const NFTA_SET_COUNT: u16 = 20;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_GEN_ID: u16 = 1;
const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
/// A dump the generation changed under (linux/netlink.h): its parts may not fit together.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// What the kernel answers for a table or set that does not exist.
const ENOENT: i32 = 2;
/// Expressions whose data is all state the kernel keeps (packets and bytes; when last seen).
const STATE_ONLY_EXPRESSIONS: [&[u8]; 2] = [b"counter", b"last"];
/// `quota`: its limit and flags are configuration, what it consumed is state.
const NFTA_QUOTA_CONSUMED: u16 = 4;
const NFTA_QUOTA_PAD: u16 = 3;
const NFTA_EXPR_DATA: u16 = 2;
/// Reads torn by a concurrent transaction (the DNS proxy commits once per answer it learns
/// from) are retried this often; then the read fails, and the drift check with it (the
/// agent rewrites a table it cannot vouch for).
const READ_ATTEMPTS: usize = 8;

/// Why a reply did not decode, or a dump was torn.
enum ReadError {
    Netlink(NetlinkError),
    Interrupted,
}

impl From<NetlinkError> for ReadError {
    fn from(e: NetlinkError) -> Self {
        Self::Netlink(e)
    }
}

impl NfSocket {
    /// The ruleset's generation (bumped by every committed transaction) in the socket's
    /// namespace.
    pub(crate) fn generation(&mut self) -> Result<Generation, NetlinkError> {
        Ok(Generation { netns: self.netns, id: self.generation_id()? })
    }

    fn generation_id(&mut self) -> Result<u32, NetlinkError> {
        let replies = match self.request(NFT_MSG_GETGEN, 0, &[], "reading", "the ruleset generation") {
            Ok(r) => r,
            Err(ReadError::Netlink(e)) => return Err(e),
            Err(ReadError::Interrupted) => return Err(NetlinkError::Protocol("an interrupted generation read".into())),
        };
        let body = replies.first().ok_or_else(|| NetlinkError::Protocol("no reply to a generation read".into()))?;
        attrs(body)
            .find(|(ty, _)| *ty == NFTA_GEN_ID)
            .and_then(|(_, v)| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_be_bytes)
            .ok_or_else(|| NetlinkError::Protocol("a generation reply without its id".into()))
    }

    /// What table `inet flock` holds (see the module doc), or `None` when it does not exist.
    pub(crate) fn read_table(&mut self) -> Result<Option<NetlinkState>, NetlinkError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.read_table_once() {
                Err(ReadError::Interrupted) if attempt < READ_ATTEMPTS => continue,
                Err(ReadError::Interrupted) => {
                    return Err(NetlinkError::Protocol("every read of table inet flock was torn by a transaction".into()));
                }
                Err(ReadError::Netlink(e)) => return Err(e),
                Ok(state) => return Ok(state),
            }
        }
    }

    fn read_table_once(&mut self) -> Result<Option<NetlinkState>, ReadError> {
        let generation = self.generation()?;
        let mut name = Vec::new();
        attr(&mut name, NFTA_TABLE_NAME, &nul_terminated(TABLE));
        let table = match self.request(NFT_MSG_GETTABLE, 0, &name, "reading", "table inet flock") {
            Err(ReadError::Netlink(NetlinkError::Refused { error, .. })) if error.raw_os_error() == Some(ENOENT) => return Ok(None),
            other => other?,
        };
        let table = table.first().map(|b| strip(b, &[NFTA_TABLE_USE, NFTA_TABLE_HANDLE, NFTA_TABLE_OWNER])).unwrap_or_default();

        let mut objects: BTreeMap<(Kind, String), NetlinkObject> = BTreeMap::new();
        let mut filter = Vec::new();
        attr(&mut filter, NFTA_CHAIN_TABLE, &nul_terminated(TABLE));
        for body in self.request(NFT_MSG_GETCHAIN, NLM_F_DUMP, &filter, "listing", "the chains of table inet flock")? {
            if string(&body, NFTA_CHAIN_TABLE).as_deref() != Some(TABLE) {
                continue;
            }
            let name = string(&body, NFTA_CHAIN_NAME).ok_or_else(|| protocol("a chain without a name"))?;
            let declaration = strip(&body, &[NFTA_CHAIN_HANDLE, NFTA_CHAIN_USE, NFTA_CHAIN_COUNTERS, NFTA_CHAIN_ID]);
            objects.insert((Kind::Chain, name), NetlinkObject { declaration, ..NetlinkObject::default() });
        }

        let mut filter = Vec::new();
        attr(&mut filter, NFTA_RULE_TABLE, &nul_terminated(TABLE));
        for body in self.request(NFT_MSG_GETRULE, NLM_F_DUMP, &filter, "listing", "the rules of table inet flock")? {
            if string(&body, NFTA_RULE_TABLE).as_deref() != Some(TABLE) {
                continue;
            }
            let chain = string(&body, NFTA_RULE_CHAIN).ok_or_else(|| protocol("a rule without its chain"))?;
            // A chain created since the chain listing: a transaction came between the two.
            let object = objects.get_mut(&(Kind::Chain, chain)).ok_or(ReadError::Interrupted)?;
            object.rules.push(rule(&body));
        }

        let mut filter = Vec::new();
        attr(&mut filter, NFTA_SET_TABLE, &nul_terminated(TABLE));
        let mut with_elements = Vec::new();
        for body in self.request(NFT_MSG_GETSET, NLM_F_DUMP, &filter, "listing", "the sets of table inet flock")? {
            if string(&body, NFTA_SET_TABLE).as_deref() != Some(TABLE) {
                continue;
            }
            let name = string(&body, NFTA_SET_NAME).ok_or_else(|| protocol("a set without a name"))?;
            let flags = attrs(&body)
                .find(|(ty, _)| *ty == NFTA_SET_FLAGS)
                .and_then(|(_, v)| <[u8; 4]>::try_from(v).ok())
                .map_or(0, u32::from_be_bytes);
            let kind = if flags & NFT_SET_MAP != 0 { Kind::Map } else { Kind::Set };
            if flags & NFT_SET_ANONYMOUS != 0 && flags & NFT_SET_TIMEOUT != 0 {
                return Err(protocol(&format!("anonymous set {name} has timeouts")));
            }
            if flags & NFT_SET_TIMEOUT == 0 {
                with_elements.push((kind, name.clone()));
            }
            let declaration = strip(&body, &[NFTA_SET_HANDLE, NFTA_SET_ID, NFTA_SET_COUNT]);
            objects.insert((kind, name), NetlinkObject { declaration, ..NetlinkObject::default() });
        }

        for (kind, set) in with_elements {
            let mut filter = Vec::new();
            attr(&mut filter, NFTA_SET_ELEM_LIST_TABLE, &nul_terminated(TABLE));
            attr(&mut filter, NFTA_SET_ELEM_LIST_SET, &nul_terminated(&set));
            let mut elements = Vec::new();
            let bodies = match self.request(NFT_MSG_GETSETELEM, NLM_F_DUMP, &filter, "listing set", &set) {
                // Deleted since the set listing: a transaction came between the two.
                Err(ReadError::Netlink(NetlinkError::Refused { error, .. })) if error.raw_os_error() == Some(ENOENT) => {
                    return Err(ReadError::Interrupted);
                }
                other => other?,
            };
            for body in bodies {
                for (ty, list) in attrs(&body) {
                    if ty != NFTA_SET_ELEM_LIST_ELEMENTS {
                        continue;
                    }
                    for (ty, element) in attrs(list) {
                        if ty == NFTA_LIST_ELEM {
                            elements.push(strip(element, &[NFTA_SET_ELEM_EXPIRATION]));
                        }
                    }
                }
            }
            // A hash set lists in no stable order.
            elements.sort_unstable();
            if let Some(object) = objects.get_mut(&(kind, set)) {
                object.elements = elements;
            }
        }
        Ok(Some(NetlinkState { generation, table, objects }))
    }

    /// One dump of `ty` (its reply bodies after nfgenmsg), read again when a transaction
    /// tore it.
    pub(super) fn dump(&mut self, ty: u16, body: &[u8], what: &'static str, object: &str) -> Result<Vec<Vec<u8>>, NetlinkError> {
        for _ in 1..READ_ATTEMPTS {
            match self.request(ty, NLM_F_DUMP, body, what, object) {
                Err(ReadError::Interrupted) => continue,
                Err(ReadError::Netlink(e)) => return Err(e),
                Ok(bodies) => return Ok(bodies),
            }
        }
        self.request(ty, NLM_F_DUMP, body, what, object).map_err(|e| match e {
            ReadError::Netlink(e) => e,
            ReadError::Interrupted => NetlinkError::Protocol(format!("every dump {what} {object} was torn by a transaction")),
        })
    }

    /// Sends one request of `ty` (a dump when `flags` says so) and collects the bodies (after
    /// nfgenmsg) of the replies to it.
    fn request(&mut self, ty: u16, flags: u16, body: &[u8], what: &'static str, object: &str) -> Result<Vec<Vec<u8>>, ReadError> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let mut request = Vec::new();
        message(&mut request, (NFNL_SUBSYS_NFTABLES << 8) | ty, NLM_F_REQUEST | flags, seq, NFPROTO_INET, 0, body);
        let n = self.socket.send(&request, 0).map_err(NetlinkError::Socket)?;
        if n != request.len() {
            return Err(NetlinkError::Protocol(format!("sent {n} of {} bytes", request.len())).into());
        }
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        let mut interrupted = false;
        let mut recv: Vec<u8> = Vec::with_capacity(64 * 1024);
        loop {
            recv.clear();
            self.socket.recv(&mut recv, 0).map_err(NetlinkError::Reply)?;
            for m in messages(&recv) {
                let (got_ty, got_flags, got_seq, reply) = m.map_err(|e| NetlinkError::Protocol(e.to_string()))?;
                if got_seq != seq {
                    continue;
                }
                interrupted |= got_flags & NLM_F_DUMP_INTR != 0;
                match got_ty {
                    NLMSG_DONE => {
                        // A dump that ended early says why in its DONE (an error code).
                        let code = reply.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map_or(0, i32::from_ne_bytes);
                        if interrupted || code == -ENOENT {
                            return Err(ReadError::Interrupted);
                        }
                        if code < 0 {
                            let error = std::io::Error::from_raw_os_error(-code);
                            return Err(NetlinkError::Refused { what, object: object.to_string(), error }.into());
                        }
                        return Ok(out);
                    }
                    NLMSG_ERROR if reply.len() >= 4 => {
                        let code = i32::from_ne_bytes([reply[0], reply[1], reply[2], reply[3]]);
                        if code != 0 {
                            let error = std::io::Error::from_raw_os_error(-code);
                            return Err(NetlinkError::Refused { what, object: object.to_string(), error }.into());
                        }
                        if !dump {
                            return Ok(out);
                        }
                    }
                    t if is_reply(t) && reply.len() >= 4 => {
                        out.push(reply[4..].to_vec());
                        if !dump {
                            return Ok(out);
                        }
                    }
                    other => return Err(NetlinkError::Protocol(format!("message type {other:#x} in reply to {what} {object}")).into()),
                }
            }
        }
    }
}

fn is_reply(ty: u16) -> bool {
    [NFT_MSG_NEWTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWGEN]
        .iter()
        .any(|m| ty == (NFNL_SUBSYS_NFTABLES << 8) | m)
}

fn protocol(what: &str) -> ReadError {
    ReadError::Netlink(NetlinkError::Protocol(what.to_string()))
}

/// A rule's attributes without what the kernel assigns, its stateful expressions without
/// their state. (Both sides of a comparison are read through here, so rewritten nests need
/// only be consistent, not byte for byte the kernel's.)
fn rule(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (ty, raw, value) in raw_attrs(body) {
        match ty {
            NFTA_RULE_HANDLE | NFTA_RULE_POSITION | NFTA_RULE_ID | NFTA_RULE_POSITION_ID | NFTA_RULE_CHAIN_ID => {}
            NFTA_RULE_EXPRESSIONS => nested(&mut out, ty, |out| {
                for (ety, eraw, evalue) in raw_attrs(value) {
                    let name = attrs(evalue).find(|(t, _)| *t == NFTA_EXPR_NAME).map(|(_, v)| v.strip_suffix(b"\0").unwrap_or(v));
                    match name {
                        // The expression's name alone: `counter` is configuration, its
                        // packets and bytes are not.
                        Some(n) if STATE_ONLY_EXPRESSIONS.contains(&n) => {
                            nested(out, ety, |out| out.extend_from_slice(&strip(evalue, &[NFTA_EXPR_DATA])));
                        }
                        Some(b"quota") => nested(out, ety, |out| {
                            for (t, a, v) in raw_attrs(evalue) {
                                if t == NFTA_EXPR_DATA {
                                    nested(out, t, |out| out.extend_from_slice(&strip(v, &[NFTA_QUOTA_CONSUMED, NFTA_QUOTA_PAD])));
                                } else {
                                    out.extend_from_slice(a);
                                }
                            }
                        }),
                        _ => out.extend_from_slice(eraw),
                    }
                }
            }),
            _ => out.extend_from_slice(raw),
        }
    }
    out
}

/// `body`'s attributes without those of the types in `drop`, as they were (headers, flags
/// and padding included).
fn strip(body: &[u8], drop: &[u16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    for (ty, raw, _) in raw_attrs(body) {
        if !drop.contains(&ty) {
            out.extend_from_slice(raw);
        }
    }
    out
}

/// A NUL-terminated string attribute.
fn string(body: &[u8], ty: u16) -> Option<String> {
    attrs(body).find(|(t, _)| *t == ty).map(|(_, v)| String::from_utf8_lossy(v.strip_suffix(b"\0").unwrap_or(v)).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(name: &str, data: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        crate::nfnetlink::nested(&mut e, NFTA_LIST_ELEM, |b| {
            attr(b, NFTA_EXPR_NAME, &nul_terminated(name));
            attr(b, 2, data);
        });
        e
    }

    fn rule_body(handle: u64, packets: u64, verdict: u8) -> Vec<u8> {
        let mut b = Vec::new();
        attr(&mut b, NFTA_RULE_TABLE, &nul_terminated(TABLE));
        attr(&mut b, NFTA_RULE_CHAIN, &nul_terminated("forward"));
        attr(&mut b, NFTA_RULE_HANDLE, &handle.to_be_bytes());
        crate::nfnetlink::nested(&mut b, NFTA_RULE_EXPRESSIONS, |e| {
            e.extend_from_slice(&expr("counter", &packets.to_be_bytes()));
            e.extend_from_slice(&expr("immediate", &[verdict, 0, 0, 0]));
        });
        b
    }

    #[test]
    fn handles_and_counter_values_are_not_what_flock_wrote() {
        let a = rule(&rule_body(7, 0, 1));
        assert_eq!(a, rule(&rule_body(99, 123_456, 1)));
        assert_ne!(a, rule(&rule_body(7, 0, 0)), "a changed verdict is a change");
        assert!(attrs(&a).all(|(t, _)| t != NFTA_RULE_HANDLE));
        // The rewritten expression list still parses: two expressions, the counter named.
        let list = attrs(&a).find(|(t, _)| *t == NFTA_RULE_EXPRESSIONS).map(|(_, v)| v).unwrap_or_default();
        let names: Vec<Option<String>> = attrs(list).map(|(_, e)| string(e, NFTA_EXPR_NAME)).collect();
        assert_eq!(names, vec![Some("counter".to_string()), Some("immediate".to_string())]);
    }

    #[test]
    fn stripping_keeps_the_other_attributes_whole() {
        let mut b = Vec::new();
        attr(&mut b, NFTA_CHAIN_TABLE, &nul_terminated(TABLE));
        attr(&mut b, NFTA_CHAIN_HANDLE, &5u64.to_be_bytes());
        attr(&mut b, NFTA_CHAIN_NAME, b"to-pods\0");
        let s = strip(&b, &[NFTA_CHAIN_HANDLE]);
        assert_eq!(string(&s, NFTA_CHAIN_NAME).as_deref(), Some("to-pods"));
        assert_eq!(attrs(&s).count(), 2);
    }
}
