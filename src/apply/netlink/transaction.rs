//! nf_tables batches for flock's transactions: the whole table (the full sync) and an
//! incremental change, without an `nft` process.
//!
//! The full sync is the transaction [`crate::apply::transaction`] writes for nft — flush the
//! chains and maps that exist, delete all but the base chain
//! ([`crate::apply::full_sync_removals`]), then create the table's content; an incremental
//! change is [`crate::apply::incremental_steps`]. Both
//! are encoded as nft 1.0 encodes them, message for message: for the content, chains first
//! (verdict-map elements name them), then every set with its elements, then every chain's
//! rules. The kernel then lists the table exactly as if nft had written it (the kernel tests
//! compare the listings of both writers, render by render and change by change).
//!
//! Why: through nft, a transaction costs nft's start, its parse of the script and, at its
//! exit, the wait of a socket closed after a commit that replaced or deleted anything (the
//! kernel frees it first; see [`super::NfSocket`]): a full resync of 150k pods paid 1.3–1.6×
//! a first load, a changed chain 10–15 ms whatever its size. Here the render is encoded
//! directly, and the socket stays open.
//!
//! Only what flock renders is encoded (the rule grammar is in [`super::rule`]); anything else
//! is an [`NetlinkError::Unsupported`] before anything is sent, and the applier writes the
//! transaction through nft instead.

use std::collections::{BTreeSet, HashMap};

use super::rule::{self, Anonymous, SetRef};
use super::{
    Batch, ElementWriter, NFT_MSG_DELSETELEM, NFT_MSG_NEWSETELEM, NFTA_DATA_VALUE, NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE, NLM_F_CREATE, NetlinkError, attr, attr_with, nested, nul_terminated, write_element, write_element_data,
};
use crate::apply::Step;
use crate::model::Family;
use crate::nft::parse::Kind;
use crate::render::names::TABLE;
use crate::render::rule::{Field as RuleField, TYPEOF_INNER_SADDR_V4, TYPEOF_INNER_SADDR_V6, TYPEOF_SADDR_V4, TYPEOF_SADDR_V6};
use crate::render::{Chain, Element, Object, Ruleset, Set};

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NLM_F_APPEND: u16 = 0x800;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_EXPR: u16 = 17;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_DESC_CONCAT: u16 = 2;
const NFTA_SET_FIELD_LEN: u16 = 1;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
const NFT_SET_INTERVAL: u32 = 0x4;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_CONCAT: u32 = 0x80;
const NFT_SET_TIMEOUT: u32 = 0x10;
/// nft's data type of verdicts.
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
/// libnftnl's user data: a table's, chain's and rule's comment is type 0.
const UDATA_COMMENT: u8 = 0;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_MERGE_ELEMENTS: u8 = 2;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
const UDATA_SET_COMMENT: u8 = 7;
const UDATA_TYPEOF_EXPR: u8 = 0;
const UDATA_TYPEOF_DATA: u8 = 1;
/// A payload field in a key's user data: its protocol header and field (`tcp dport`: the
/// header's second field).
const UDATA_TYPEOF_PAYLOAD_DESC: u8 = 0;
const UDATA_TYPEOF_PAYLOAD_FIELD: u8 = 1;
const DPORT_FIELD: u32 = 2;
/// nft's expression type of a payload field (`EXPR_PAYLOAD`).
const EXPR_PAYLOAD: u32 = 7;
/// nft's data type of ports.
const INET_SERVICE: u32 = 13;
/// nft's data type of a raw field.
const INTEGER: u32 = 4;
/// A raw payload field in a key's user data: its base (nft's `PROTO_BASE_TRANSPORT_HDR`),
/// offset and length in bits.
const UDATA_TYPEOF_PAYLOAD_BASE: u8 = 2;
const UDATA_TYPEOF_PAYLOAD_OFFSET: u8 = 3;
const UDATA_TYPEOF_PAYLOAD_LEN: u8 = 4;
const PROTO_BASE_TRANSPORT_HDR: u32 = 3;
/// A concatenation's part in a key's user data: its expression type and data.
const UDATA_CONCAT_SUB_TYPE: u8 = 0;
const UDATA_CONCAT_SUB_DATA: u8 = 1;

/// nft's ids of the IPv4 and IPv6 headers (`PROTO_DESC_IP`, `PROTO_DESC_IP6`) and of their
/// source fields (`IPHDR_SADDR`, `IP6HDR_SADDR`).
const PROTO_DESC_IP: u32 = 12;
const PROTO_DESC_IP6: u32 = 13;
const IPHDR_SADDR: u32 = 11;
const IP6HDR_SADDR: u32 = 8;

/// The user data nft records for a `typeof` key part: a payload field's protocol header and
/// field, or for a raw field (`@th,OFFSET,LEN`) its base, offset and length.
fn typeof_part(part: &str) -> Result<Vec<u8>, String> {
    let u = |v: u32| v.to_ne_bytes();
    let header = |out: &mut Vec<u8>, desc: u32, field: u32| -> Result<(), String> {
        udata(out, UDATA_TYPEOF_PAYLOAD_DESC, &u(desc))?;
        udata(out, UDATA_TYPEOF_PAYLOAD_FIELD, &u(field))
    };
    let mut out = Vec::new();
    match part {
        TYPEOF_SADDR_V4 => header(&mut out, PROTO_DESC_IP, IPHDR_SADDR)?,
        TYPEOF_SADDR_V6 => header(&mut out, PROTO_DESC_IP6, IP6HDR_SADDR)?,
        TYPEOF_INNER_SADDR_V4 | TYPEOF_INNER_SADDR_V6 => {
            let fam = if part == TYPEOF_INNER_SADDR_V4 { Family::V4 } else { Family::V6 };
            let (offset, len) = RuleField::inner_saddr(fam);
            header(&mut out, 0, 0)?;
            udata(&mut out, UDATA_TYPEOF_PAYLOAD_BASE, &u(PROTO_BASE_TRANSPORT_HDR))?;
            udata(&mut out, UDATA_TYPEOF_PAYLOAD_OFFSET, &u(offset))?;
            udata(&mut out, UDATA_TYPEOF_PAYLOAD_LEN, &u(len))?;
        }
        other => return Err(format!("key part {other}")),
    }
    Ok(out)
}

/// A `typeof` concatenation's user data: per part, in a nest numbered by its position, the
/// part's expression type (a payload field) and [`typeof_part`].
fn typeof_concat(parts: &[&str]) -> Result<Vec<u8>, String> {
    let mut data = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let mut nest = Vec::new();
        udata(&mut nest, UDATA_CONCAT_SUB_TYPE, &EXPR_PAYLOAD.to_ne_bytes())?;
        udata(&mut nest, UDATA_CONCAT_SUB_DATA, &typeof_part(part)?)?;
        udata(&mut data, u8::try_from(i).map_err(|_| "too many key parts".to_string())?, &nest)?;
    }
    Ok(data)
}
/// nft's expression type of a concatenation (`EXPR_CONCAT`), recorded in a concatenated
/// key's user data.
const EXPR_CONCAT: u32 = 13;
/// nft's byte orders (`BYTEORDER_HOST_ENDIAN`, `BYTEORDER_BIG_ENDIAN`).
const HOST_ENDIAN: u32 = 1;
const BIG_ENDIAN: u32 = 2;

/// What nft knows of a key type: its id, length in bytes and byte order.
pub(super) struct KeyType {
    pub(crate) id: u32,
    pub(crate) len: usize,
    pub(crate) byteorder: u32,
}

pub(super) fn key_type(name: &str) -> Option<KeyType> {
    let (id, len, byteorder) = match name {
        "ipv4_addr" | TYPEOF_SADDR_V4 => (7, 4, BIG_ENDIAN),
        "ipv6_addr" | TYPEOF_SADDR_V6 => (8, 16, BIG_ENDIAN),
        // A raw field's type is nft's integer.
        TYPEOF_INNER_SADDR_V4 => (INTEGER, 4, BIG_ENDIAN),
        TYPEOF_INNER_SADDR_V6 => (INTEGER, 16, BIG_ENDIAN),
        "inet_proto" => (12, 1, 0),
        "inet_service" => (13, 2, BIG_ENDIAN),
        "ifname" => (41, 16, HOST_ENDIAN),
        _ => return None,
    };
    Some(KeyType { id, len, byteorder })
}

/// A libnftnl user-data TLV's header for a value of `len` bytes: its type, and its length
/// in a byte (a longer value cannot be written).
fn udata_header(ty: u8, len: usize) -> Result<[u8; 2], String> {
    let len = u8::try_from(len).map_err(|_| format!("{len} bytes of user data"))?;
    Ok([ty, len])
}

/// A libnftnl user-data TLV: type, length (a byte), value.
fn udata(out: &mut Vec<u8>, ty: u8, value: &[u8]) -> Result<(), String> {
    out.extend_from_slice(&udata_header(ty, value.len())?);
    out.extend_from_slice(value);
    Ok(())
}

/// Appends attribute `attr_ty` holding `comment` as libnftnl user data of type `ty`
/// (NUL-terminated), written in place.
pub(super) fn comment_attr(out: &mut Vec<u8>, attr_ty: u16, ty: u8, comment: &str) -> Result<(), String> {
    let header = udata_header(ty, comment.len() + 1)?;
    attr_with(out, attr_ty, |b| {
        b.extend_from_slice(&header);
        b.extend_from_slice(comment.as_bytes());
        b.push(0);
    });
    Ok(())
}

fn unsupported(object: &str, what: impl Into<String>, why: impl Into<String>) -> NetlinkError {
    NetlinkError::Unsupported { object: object.to_string(), what: what.into(), why: why.into() }
}

/// The full-sync transaction for `rs` over the table's `existing` objects as one batch (see
/// the module doc).
pub(crate) fn encode_full(rs: &Ruleset, existing: &BTreeSet<(Kind, String)>) -> Result<Batch, NetlinkError> {
    let mut batch = Batch::new();
    let table = format!("table {TABLE}");
    let mut body = Vec::new();
    attr(&mut body, NFTA_TABLE_NAME, &nul_terminated(TABLE));
    attr(&mut body, NFTA_TABLE_FLAGS, &0u32.to_be_bytes());
    comment_attr(&mut body, NFTA_TABLE_USERDATA, UDATA_COMMENT, &rs.comment).map_err(|why| unsupported(&table, "its comment", why))?;
    batch.push(NFT_MSG_NEWTABLE, NLM_F_CREATE, &body, "creating", &table);

    let (flush, delete) = crate::apply::full_sync_removals(rs, existing);
    for (kind, name) in flush {
        match kind {
            Kind::Chain => batch.push(NFT_MSG_DELRULE, 0, &chain_ref(NFTA_RULE_TABLE, NFTA_RULE_CHAIN, name), "flushing chain", name),
            _ => batch.push(NFT_MSG_DELSETELEM, 0, &set_ref(name), "flushing map", name),
        }
    }
    for (kind, name) in delete {
        match kind {
            Kind::Chain => batch.push(NFT_MSG_DELCHAIN, 0, &chain_ref(NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, name), "deleting chain", name),
            Kind::Map => batch.push(NFT_MSG_DELSET, 0, &chain_ref(NFTA_SET_TABLE, NFTA_SET_NAME, name), "deleting map", name),
            Kind::Set => batch.push(NFT_MSG_DELSET, 0, &chain_ref(NFTA_SET_TABLE, NFTA_SET_NAME, name), "deleting set", name),
        }
    }

    // An object the batch cannot carry sends the whole transaction through nft (the batch is
    // dropped unsent).
    let chains: Vec<&Chain> = rs.objects.iter().filter_map(|o| if let Object::Chain(c) = o { Some(c) } else { None }).collect();
    let sets: Vec<&Set> = rs.objects.iter().filter_map(|o| if let Object::Set(s) = o { Some(s) } else { None }).collect();
    let mut refs: HashMap<&str, SetRef<'_>> = HashMap::new();
    for (i, s) in sets.iter().enumerate() {
        let id = u32::try_from(i + 1).map_err(|_| unsupported(&s.name, "its id", "too many sets"))?;
        refs.insert(s.name.as_str(), SetRef { set: s, id });
    }
    let chain_bodies = chains.iter().map(|c| encode_chain(c)).collect::<Result<Vec<_>, _>>()?;
    for (c, body) in chains.iter().zip(&chain_bodies) {
        batch.push(NFT_MSG_NEWCHAIN, NLM_F_CREATE, body, "creating chain", &c.name);
    }
    for s in &sets {
        push_set(&mut batch, s, &refs)?;
        let mut w = ElementWriter::new(&mut batch, &s.name, None, NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding elements to set");
        write_elements(&mut w, s, s.elements.iter())?;
    }
    let mut next_id = u32::try_from(sets.len()).unwrap_or(u32::MAX);
    for c in &chains {
        push_rules(&mut batch, c, &refs, &mut next_id)?;
    }
    Ok(batch)
}

/// An incremental transaction — `steps` towards `next` — as one batch.
pub(crate) fn encode_steps(steps: &[Step<'_>], next: &Ruleset) -> Result<Batch, NetlinkError> {
    // Rules may look up every set of `next`: those declared here also by their id.
    let mut refs: HashMap<&str, SetRef<'_>> = HashMap::new();
    for o in &next.objects {
        if let Object::Set(set) = o {
            refs.insert(set.name.as_str(), SetRef { set, id: 0 });
        }
    }
    let mut next_id = 0;
    for step in steps {
        if let Step::Declare(Object::Set(set)) = step {
            next_id += 1;
            refs.insert(set.name.as_str(), SetRef { set, id: next_id });
        }
    }
    let mut batch = Batch::new();
    for step in steps {
        match step {
            Step::Declare(Object::Chain(c)) => batch.push(NFT_MSG_NEWCHAIN, NLM_F_CREATE, &encode_chain(c)?, "creating chain", &c.name),
            Step::Declare(Object::Set(s)) => push_set(&mut batch, s, &refs)?,
            Step::Flush { keyword: "chain", name } => {
                batch.push(NFT_MSG_DELRULE, 0, &chain_ref(NFTA_RULE_TABLE, NFTA_RULE_CHAIN, name), "flushing chain", name)
            }
            Step::Flush { name, .. } => batch.push(NFT_MSG_DELSETELEM, 0, &set_ref(name), "flushing set", name),
            Step::DeleteElements { set, elements } => {
                let mut w = ElementWriter::new(&mut batch, &set.name, None, NFT_MSG_DELSETELEM, 0, "deleting elements of set");
                for e in elements {
                    w.element(|b| write_element(set, e, false, b))?;
                }
            }
            Step::AddElements { set, elements } => {
                let mut w = ElementWriter::new(&mut batch, &set.name, None, NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding elements to set");
                write_elements(&mut w, set, elements.iter().copied())?;
            }
            Step::Rules(c) => push_rules(&mut batch, c, &refs, &mut next_id)?,
            Step::Delete { keyword: "chain", name } => {
                batch.push(NFT_MSG_DELCHAIN, 0, &chain_ref(NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, name), "deleting chain", name)
            }
            Step::Delete { keyword, name } => batch.push(
                NFT_MSG_DELSET,
                0,
                &chain_ref(NFTA_SET_TABLE, NFTA_SET_NAME, name),
                if *keyword == "map" { "deleting map" } else { "deleting set" },
                name,
            ),
        }
    }
    Ok(batch)
}

/// Declares set or map `s` (with its id in `refs`), without elements.
fn push_set(batch: &mut Batch, s: &Set, refs: &HashMap<&str, SetRef<'_>>) -> Result<(), NetlinkError> {
    let id = refs.get(s.name.as_str()).map_or(0, |r| r.id);
    let what = if s.data.is_some() { "creating map" } else { "creating set" };
    batch.push(NFT_MSG_NEWSET, NLM_F_CREATE, &encode_set(s, id)?, what, &s.name);
    Ok(())
}

/// The rules of chain `c`, appended, each after the anonymous sets it looks up (as nft
/// sends them); `next_id` is the batch's last set id.
fn push_rules(batch: &mut Batch, c: &Chain, refs: &HashMap<&str, SetRef<'_>>, next_id: &mut u32) -> Result<(), NetlinkError> {
    let object = format!("chain {}", c.name);
    for r in c.rules.iter() {
        let what = || format!("rule `{r}`");
        let compiled = rule::compile(r, refs, next_id).map_err(|why| unsupported(&object, what(), why))?;
        let mut body = chain_ref(NFTA_RULE_TABLE, NFTA_RULE_CHAIN, &c.name);
        nested(&mut body, NFTA_RULE_EXPRESSIONS, |b| {
            for e in &compiled.exprs {
                nested(b, NFTA_LIST_ELEM, |x| x.extend_from_slice(e));
            }
        });
        if let Some(comment) = &compiled.comment {
            comment_attr(&mut body, NFTA_RULE_USERDATA, UDATA_COMMENT, comment).map_err(|why| unsupported(&object, what(), why))?;
        }
        for a in &compiled.anonymous {
            let elements = anonymous_elements(a);
            batch.push(NFT_MSG_NEWSET, NLM_F_CREATE, &anonymous_set(a, elements.len()), "creating a set of ports for a rule of", &object);
            let mut w =
                ElementWriter::new(batch, rule::ANONYMOUS_SET, Some(a.id), NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding ports to a set of");
            for el in elements {
                w.element(|b| {
                    match el {
                        PortElement::Port(port) => nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &port.to_be_bytes())),
                        PortElement::End(port) => interval_end(&port.to_be_bytes(), b),
                    }
                    Ok::<(), NetlinkError>(())
                })?;
            }
        }
        batch.push(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, &body, "adding a rule to chain", &c.name);
    }
    Ok(())
}

/// A rule's set of ports as nft declares it: anonymous and constant (interval when a range
/// is among the ports), its size, and nft's user data — the key's byte order, the merging of
/// intervals, and the key as the payload field it was written as (`tcp dport`).
fn anonymous_set(a: &Anonymous, size: usize) -> Vec<u8> {
    let mut flags = NFT_SET_ANONYMOUS | NFT_SET_CONSTANT;
    if a.interval {
        flags |= NFT_SET_INTERVAL;
    }
    let mut body = chain_ref(NFTA_SET_TABLE, NFTA_SET_NAME, rule::ANONYMOUS_SET);
    attr(&mut body, NFTA_SET_FLAGS, &flags.to_be_bytes());
    attr(&mut body, NFTA_SET_KEY_TYPE, &INET_SERVICE.to_be_bytes());
    attr(&mut body, NFTA_SET_KEY_LEN, &2u32.to_be_bytes());
    attr(&mut body, NFTA_SET_ID, &a.id.to_be_bytes());
    nested(&mut body, NFTA_SET_DESC, |d| attr(d, NFTA_SET_DESC_SIZE, &(size as u32).to_be_bytes()));
    // Every TLV here is a few bytes: `udata` cannot fail.
    let mut ud = Vec::new();
    let _ = udata(&mut ud, UDATA_SET_KEYBYTEORDER, &BIG_ENDIAN.to_ne_bytes());
    if a.interval {
        let _ = udata(&mut ud, UDATA_SET_MERGE_ELEMENTS, &1u32.to_ne_bytes());
    }
    let mut field = Vec::new();
    let _ = udata(&mut field, UDATA_TYPEOF_PAYLOAD_DESC, &a.proto_desc.to_ne_bytes());
    let _ = udata(&mut field, UDATA_TYPEOF_PAYLOAD_FIELD, &DPORT_FIELD.to_ne_bytes());
    let mut typeof_ = Vec::new();
    let _ = udata(&mut typeof_, UDATA_TYPEOF_EXPR, &EXPR_PAYLOAD.to_ne_bytes());
    let _ = udata(&mut typeof_, UDATA_TYPEOF_DATA, &field);
    let _ = udata(&mut ud, UDATA_SET_KEY_TYPEOF, &typeof_);
    attr(&mut body, NFTA_SET_USERDATA, &ud);
    body
}

/// An element of a rule's set of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortElement {
    /// A port, or where a range starts.
    Port(u16),
    /// Where a range ends (exclusive).
    End(u16),
}

/// A set of ports' elements: each port, or for an interval set each range split as a named
/// interval set's ([`write_elements`]).
fn anonymous_elements(a: &Anonymous) -> Vec<PortElement> {
    let mut out = Vec::with_capacity(a.ranges.len() * 2 + 1);
    for (i, (lo, hi)) in a.ranges.iter().enumerate() {
        if a.interval && i == 0 && *lo != 0 {
            out.push(PortElement::End(0));
        }
        out.push(PortElement::Port(*lo));
        if a.interval
            && let Some(next) = hi.checked_add(1)
        {
            out.push(PortElement::End(next));
        }
    }
    out
}

/// The table's name and an object's name under attributes `table` and `name`.
fn chain_ref(table: u16, name_attr: u16, name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    attr(&mut body, table, &nul_terminated(TABLE));
    attr(&mut body, name_attr, &nul_terminated(name));
    body
}

/// A set's elements message without elements: the whole set.
fn set_ref(name: &str) -> Vec<u8> {
    chain_ref(NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, name)
}

fn hook_number(hook: &str) -> Option<u32> {
    Some(match hook {
        "prerouting" => 0,
        "input" => 1,
        "forward" => 2,
        "output" => 3,
        "postrouting" => 4,
        _ => return None,
    })
}

/// A priority by name (`filter`), number, or name and offset (`filter - 1`), as nft reads it.
fn priority(p: &str) -> Option<i32> {
    if let Some((name, offset)) = p.split_once(" - ") {
        return priority(name)?.checked_sub(offset.parse().ok()?);
    }
    if let Some((name, offset)) = p.split_once(" + ") {
        return priority(name)?.checked_add(offset.parse().ok()?);
    }
    Some(match p {
        "raw" => -300,
        "mangle" => -150,
        "dstnat" => -100,
        "filter" => 0,
        "security" => 50,
        "srcnat" => 100,
        n => n.parse().ok()?,
    })
}

fn encode_chain(c: &Chain) -> Result<Vec<u8>, NetlinkError> {
    let object = format!("chain {}", c.name);
    let mut body = chain_ref(NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, &c.name);
    if let Some(h) = &c.hook {
        let (Some(hooknum), Some(prio)) = (hook_number(h.hook), priority(h.priority)) else {
            return Err(unsupported(&object, "its hook", format!("hook {} priority {}", h.hook, h.priority)));
        };
        let policy: u32 = match h.policy {
            "accept" => 1,
            "drop" => 0,
            other => return Err(unsupported(&object, "its policy", other)),
        };
        if h.type_ != "filter" {
            return Err(unsupported(&object, "its type", h.type_));
        }
        attr(&mut body, NFTA_CHAIN_TYPE, &nul_terminated(h.type_));
        attr(&mut body, NFTA_CHAIN_POLICY, &policy.to_be_bytes());
        nested(&mut body, NFTA_CHAIN_HOOK, |b| {
            attr(b, NFTA_HOOK_HOOKNUM, &hooknum.to_be_bytes());
            attr(b, NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
        });
    }
    comment_attr(&mut body, NFTA_CHAIN_USERDATA, UDATA_COMMENT, &c.comment).map_err(|why| unsupported(&object, "its comment", why))?;
    Ok(body)
}

/// A set's declaration as nft sends it: flags, key (a concatenation's type is its parts'
/// ids six bits apart, its length their 32-bit-rounded sum), data, id, the concatenation's
/// field lengths (interval concatenations only) and nft's user data (byte orders, the key's
/// expression type, the comment).
fn encode_set(s: &Set, id: u32) -> Result<Vec<u8>, NetlinkError> {
    let object = format!("set {}", s.name);
    let types = s
        .key
        .iter()
        .map(|t| key_type(t).ok_or_else(|| unsupported(&object, "its key", format!("type {t}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let concat = types.len() > 1;
    let (type_id, key_len) = if concat {
        (types.iter().fold(0u32, |acc, t| (acc << 6) | t.id), types.iter().map(|t| t.len.next_multiple_of(4)).sum::<usize>())
    } else {
        let t = types.first().ok_or_else(|| unsupported(&object, "its key", "no type"))?;
        (t.id, t.len)
    };
    let map = match s.data {
        None => false,
        Some("verdict") => true,
        Some(other) => return Err(unsupported(&object, "its data", other)),
    };
    let mut flags = 0;
    if s.interval {
        flags |= NFT_SET_INTERVAL;
        if concat {
            flags |= NFT_SET_CONCAT;
        }
    }
    if map {
        flags |= NFT_SET_MAP;
    }
    if s.timeout {
        flags |= NFT_SET_TIMEOUT;
    }
    let mut body = chain_ref(NFTA_SET_TABLE, NFTA_SET_NAME, &s.name);
    attr(&mut body, NFTA_SET_FLAGS, &flags.to_be_bytes());
    attr(&mut body, NFTA_SET_KEY_TYPE, &type_id.to_be_bytes());
    attr(&mut body, NFTA_SET_KEY_LEN, &(key_len as u32).to_be_bytes());
    if map {
        attr(&mut body, NFTA_SET_DATA_TYPE, &NFT_DATA_VERDICT.to_be_bytes());
        attr(&mut body, NFTA_SET_DATA_LEN, &0u32.to_be_bytes());
    }
    attr(&mut body, NFTA_SET_ID, &id.to_be_bytes());
    if concat && s.interval {
        nested(&mut body, NFTA_SET_DESC, |d| {
            nested(d, NFTA_SET_DESC_CONCAT, |c| {
                for t in &types {
                    nested(c, NFTA_LIST_ELEM, |e| attr(e, NFTA_SET_FIELD_LEN, &(t.len as u32).to_be_bytes()));
                }
            })
        });
    }
    let mut ud = Vec::new();
    let keyorder = if concat { 0 } else { types.first().map_or(0, |t| t.byteorder) };
    let err = |why| unsupported(&object, "its user data", why);
    udata(&mut ud, UDATA_SET_KEYBYTEORDER, &keyorder.to_ne_bytes()).map_err(err)?;
    if map {
        udata(&mut ud, UDATA_SET_DATABYTEORDER, &0u32.to_ne_bytes()).map_err(err)?;
    }
    if concat {
        // A key declared by type records its concatenation's parts by their types alone (no
        // expressions); one declared by its expressions records them.
        let parts = if s.is_typeof() { typeof_concat(&s.key).map_err(err)? } else { Vec::new() };
        let mut typeof_ = Vec::new();
        udata(&mut typeof_, UDATA_TYPEOF_EXPR, &EXPR_CONCAT.to_ne_bytes()).map_err(err)?;
        udata(&mut typeof_, UDATA_TYPEOF_DATA, &parts).map_err(err)?;
        udata(&mut ud, UDATA_SET_KEY_TYPEOF, &typeof_).map_err(err)?;
    }
    if map {
        udata(&mut ud, UDATA_SET_DATA_INTERVAL, &0u32.to_ne_bytes()).map_err(err)?;
    }
    udata(&mut ud, UDATA_SET_COMMENT, &nul_terminated(&s.comment)).map_err(err)?;
    attr(&mut body, NFTA_SET_USERDATA, &ud);
    if let Some((rate, burst)) = s.limit {
        // The kernel gives each element a copy of it.
        nested(&mut body, NFTA_SET_EXPR, |b| b.extend(rule::limit(rate, burst)));
    }
    Ok(body)
}

/// Writes a set's elements to `w`. An interval set's elements are ranges: a
/// concatenation's carry their first and last key; a single field's are split as nft splits
/// them — the range's start (with its data and comment), then the key after its end flagged
/// as an interval's end, and an end at zero before the first range when it does not start
/// there.
fn write_elements<'e>(w: &mut ElementWriter<'_>, s: &Set, elements: impl IntoIterator<Item = &'e Element>) -> Result<(), NetlinkError> {
    if !s.interval {
        for e in elements {
            w.element(|b| write_element(s, e, true, b))?;
        }
        return Ok(());
    }
    let err = |e: &Element, why: String| NetlinkError::Encode { set: s.name.clone(), key: e.key.to_string(), why };
    let concat = s.key.len() > 1;
    for (i, e) in elements.into_iter().enumerate() {
        let (start, end) = super::key_range(&s.key, &e.key).map_err(|why| err(e, why))?;
        if concat {
            w.element(|b| {
                nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &start));
                nested(b, NFTA_SET_ELEM_KEY_END, |b| attr(b, NFTA_DATA_VALUE, &end));
                write_element_data(s, e, b)
            })?;
            continue;
        }
        if i == 0 && start.iter().any(|b| *b != 0) {
            w.element(|b| {
                interval_end(&vec![0; start.len()], b);
                Ok::<(), NetlinkError>(())
            })?;
        }
        w.element(|b| {
            nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &start));
            write_element_data(s, e, b)
        })?;
        if let Some(next) = increment(&end) {
            w.element(|b| {
                interval_end(&next, b);
                Ok::<(), NetlinkError>(())
            })?;
        }
    }
    Ok(())
}

/// An element marking where an interval ends (at `key`, exclusive).
fn interval_end(key: &[u8], el: &mut Vec<u8>) {
    attr(el, NFTA_SET_ELEM_FLAGS, &NFT_SET_ELEM_INTERVAL_END.to_be_bytes());
    nested(el, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, key));
}

/// The key + 1, or `None` past the last key.
fn increment(key: &[u8]) -> Option<Vec<u8>> {
    let mut next = key.to_vec();
    for b in next.iter_mut().rev() {
        let (v, carry) = b.overflowing_add(1);
        *b = v;
        if !carry {
            return Some(next);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_ends_follow_the_range() {
        assert_eq!(increment(&[198, 18, 1, 255]).unwrap(), [198, 18, 2, 0]);
        assert_eq!(increment(&[255, 255]), None);
    }

    #[test]
    fn a_rule_s_port_ranges_are_split_as_nft_splits_them() {
        use PortElement::{End, Port};
        let a = |ranges: Vec<(u16, u16)>, interval| Anonymous { id: 1, proto_desc: 0, ranges, interval };
        assert_eq!(anonymous_elements(&a(vec![(53, 53), (80, 80)], false)), [Port(53), Port(80)]);
        assert_eq!(anonymous_elements(&a(vec![(53, 53), (8000, 8100)], true)), [End(0), Port(53), End(54), Port(8000), End(8101)]);
        // A range from 0 needs no leading end; one up to 65535 has no end.
        assert_eq!(anonymous_elements(&a(vec![(0, 10), (60000, 65535)], true)), [Port(0), End(11), Port(60000)]);
    }

    #[test]
    fn concatenated_key_types_are_six_bits_apart() {
        let t = |n| key_type(n).unwrap().id;
        assert_eq!((t("ipv4_addr") << 12) | (t("inet_proto") << 6) | t("inet_service"), 0x730d);
        assert_eq!((t("ifname") << 6) | t("ipv4_addr"), 0xa47);
    }
}
