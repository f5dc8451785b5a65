//! flock's rules compiled to nf_tables expressions, as nft 1.0 compiles them.
//!
//! The grammar is the renderer's, no more: `ct state LIST`; `meta l4proto P`; `tcp|udp|sctp
//! dport N|A-B`; `iifname|oifname "prefix*"`; `limit rate N/second [burst M packets]`; `log
//! [prefix "P"] group G`; `icmpv6 type NAME`; `ct mark & BIT == BIT`; `meta mark & BIT == BIT`; `ct|meta mark set
//! ct|meta mark | BIT`; `ct direction DIR`; `tproxy to :PORT`, `tproxy ip|ip6 to ADDR:PORT`; `reject with tcp reset`; a field or a concatenation of fields
//! (`iifname`, `oifname`, `ip|ip6 saddr|daddr`, `meta l4proto`, `th dport`) looked up in a
//! named set (`@set`, `!= @set`) or verdict map (`vmap @map`); `counter`; a verdict; a
//! comment. Anything else is an error, and the caller writes through nft instead.
//!
//! What nft adds is added here too, in its order: a match on an address of one family first
//! checks the family (`meta nfproto`), a port of one protocol the protocol (`meta l4proto`);
//! a concatenation fills 32-bit registers from the first, a part that starts a 128-bit
//! register named as that register; the protocol in a concatenation looked up in an interval
//! set is converted to network order (`byteorder`); a set is named and given by its id in
//! the batch when the batch declares it.

use std::collections::HashMap;

use super::{NFTA_DATA_VALUE, attr, nested, nul_terminated, protocol_number, verdict_data};
use crate::nft::parse::{Tok, tokenize};
use crate::render::Set;

const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
const NFTA_LOOKUP_SET_ID: u16 = 4;
const NFTA_LOOKUP_FLAGS: u16 = 5;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_CMP_LTE: u32 = 3;
const NFT_CMP_GTE: u32 = 5;
const NFT_LOOKUP_F_INV: u32 = 1;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CT_STATE: u32 = 0;
const NFT_CT_MARK: u32 = 3;
const NFT_CT_DIRECTION: u32 = 1;
const NFTA_CT_SREG: u16 = 4;
const NFTA_META_SREG: u16 = 3;
const NFT_META_MARK: u32 = 3;
const NFTA_TPROXY_FAMILY: u16 = 1;
const NFTA_TPROXY_REG_ADDR: u16 = 2;
const NFTA_TPROXY_REG_PORT: u16 = 3;
const NFTA_LIMIT_RATE: u16 = 1;
const NFTA_LIMIT_UNIT: u16 = 2;
const NFTA_LIMIT_BURST: u16 = 3;
const NFTA_LIMIT_TYPE: u16 = 4;
const NFTA_LIMIT_FLAGS: u16 = 5;
const NFT_LIMIT_PKTS: u32 = 0;
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_LOG_PREFIX: u16 = 2;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFT_REJECT_TCP_RST: u32 = 1;
/// The name nft gives an anonymous set: the kernel numbers it.
pub const ANONYMOUS_SET: &str = "__set%d";
/// nft's protocol header ids (`enum proto_desc_id`).
const PROTO_DESC_UDP: u32 = 6;
const PROTO_DESC_TCP: u32 = 8;
const PROTO_DESC_SCTP: u32 = 10;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// The verdict register, and the first 128-bit one.
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG32_00: u32 = 8;

/// A named set a rule may look up: its id in the batch that declares it, else 0.
pub struct SetRef<'a> {
    pub set: &'a Set,
    pub id: u32,
}

/// A rule's expressions (each the content of an `NFTA_LIST_ELEM`), comment, and the
/// anonymous sets its expressions look up (declared in the batch before the rule).
pub struct Compiled {
    pub exprs: Vec<Vec<u8>>,
    pub comment: Option<String>,
    pub anonymous: Vec<Anonymous>,
}

/// A set of ports written in the rule (`tcp dport { 80, 443, 8000-8080 }`): nft makes it an
/// anonymous, constant set of the rule, an interval set when a range is among them.
pub struct Anonymous {
    pub id: u32,
    /// nft's id of the protocol header (`PROTO_DESC_*`) the ports are read from.
    pub proto_desc: u32,
    /// Inclusive ranges, sorted, adjacent ones merged (nft merges them).
    pub ranges: Vec<(u16, u16)>,
    pub interval: bool,
}

/// One part of what a rule matches.
#[derive(Clone, Copy)]
enum Field {
    Meta { key: u32, len: usize },
    Payload { base: u32, offset: u32, len: usize, family: Option<u8> },
}

impl Field {
    fn len(self) -> usize {
        match self {
            Self::Meta { len, .. } | Self::Payload { len, .. } => len,
        }
    }
}

const L4PROTO: Field = Field::Meta { key: NFT_META_L4PROTO, len: 1 };
const DPORT: Field = Field::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2, family: None };

fn expr(name: &str, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    attr(&mut out, NFTA_EXPR_NAME, &nul_terminated(name));
    nested(&mut out, NFTA_EXPR_DATA, fill);
    out
}

fn u32_attr(out: &mut Vec<u8>, ty: u16, v: u32) {
    attr(out, ty, &v.to_be_bytes());
}

fn load(field: Field, reg: u32) -> Vec<u8> {
    match field {
        Field::Meta { key, .. } => expr("meta", |b| {
            u32_attr(b, NFTA_META_DREG, reg);
            u32_attr(b, NFTA_META_KEY, key);
        }),
        Field::Payload { base, offset, len, .. } => expr("payload", |b| {
            u32_attr(b, NFTA_PAYLOAD_DREG, reg);
            u32_attr(b, NFTA_PAYLOAD_BASE, base);
            u32_attr(b, NFTA_PAYLOAD_OFFSET, offset);
            u32_attr(b, NFTA_PAYLOAD_LEN, len as u32);
        }),
    }
}

fn cmp(op: u32, data: &[u8]) -> Vec<u8> {
    expr("cmp", |b| {
        u32_attr(b, NFTA_CMP_SREG, NFT_REG_1);
        u32_attr(b, NFTA_CMP_OP, op);
        nested(b, NFTA_CMP_DATA, |d| attr(d, NFTA_DATA_VALUE, data));
    })
}

/// A 32-bit conntrack key (host order: the state, the mark) loaded and masked with `mask`.
fn ct_masked(key: u32, mask: u32) -> [Vec<u8>; 2] {
    let ct = expr("ct", |b| {
        u32_attr(b, NFTA_CT_DREG, NFT_REG_1);
        u32_attr(b, NFTA_CT_KEY, key);
    });
    masked(ct, mask)
}

/// A 32-bit value loaded by `load` into register 1, masked with `mask` (host order).
fn masked(load: Vec<u8>, mask: u32) -> [Vec<u8>; 2] {
    [
        load,
        expr("bitwise", |b| {
            u32_attr(b, NFTA_BITWISE_SREG, NFT_REG_1);
            u32_attr(b, NFTA_BITWISE_DREG, NFT_REG_1);
            u32_attr(b, NFTA_BITWISE_LEN, 4);
            nested(b, NFTA_BITWISE_MASK, |d| attr(d, NFTA_DATA_VALUE, &mask.to_ne_bytes()));
            nested(b, NFTA_BITWISE_XOR, |d| attr(d, NFTA_DATA_VALUE, &0u32.to_ne_bytes()));
        }),
    ]
}

/// `KEY |= bit` for a 32-bit mark (the conntrack entry's, `ct`, or the packet's, `meta`):
/// load, set the bit (`(x & !bit) ^ bit`), store — as nft compiles `ct mark set ct mark | B`.
fn mark_or(ct: bool, bit: u32) -> [Vec<u8>; 3] {
    let name = if ct { "ct" } else { "meta" };
    let (dreg, key, sreg, k) = if ct {
        (NFTA_CT_DREG, NFTA_CT_KEY, NFTA_CT_SREG, NFT_CT_MARK)
    } else {
        (NFTA_META_DREG, NFTA_META_KEY, NFTA_META_SREG, NFT_META_MARK)
    };
    [
        expr(name, |b| {
            u32_attr(b, dreg, NFT_REG_1);
            u32_attr(b, key, k);
        }),
        expr("bitwise", |b| {
            u32_attr(b, NFTA_BITWISE_SREG, NFT_REG_1);
            u32_attr(b, NFTA_BITWISE_DREG, NFT_REG_1);
            u32_attr(b, NFTA_BITWISE_LEN, 4);
            nested(b, NFTA_BITWISE_MASK, |d| attr(d, NFTA_DATA_VALUE, &(!bit).to_ne_bytes()));
            nested(b, NFTA_BITWISE_XOR, |d| attr(d, NFTA_DATA_VALUE, &bit.to_ne_bytes()));
        }),
        expr(name, |b| {
            u32_attr(b, key, k);
            u32_attr(b, sreg, NFT_REG_1);
        }),
    ]
}

/// `0x…` as a 32-bit mark value.
fn mark_value(text: Option<&str>) -> Result<u32, String> {
    let t = text.ok_or("a mark without a value")?;
    t.strip_prefix("0x").and_then(|h| u32::from_str_radix(h, 16).ok()).ok_or_else(|| format!("mark {t}"))
}

/// The register a part starting at 32-bit register `slot` is loaded into.
fn register(slot: usize) -> u32 {
    let slot = slot as u32;
    if slot.is_multiple_of(4) { NFT_REG_1 + slot / 4 } else { NFT_REG32_00 + slot }
}

/// Compiles one rule as the renderer writes it; `sets` are the named sets it may look up,
/// `next_id` the batch's next set id (taken by the rule's anonymous sets).
pub fn compile(rule: &str, sets: &HashMap<&str, SetRef<'_>>, next_id: &mut u32) -> Result<Compiled, String> {
    let toks: Vec<Tok<'_>> = tokenize(rule).map_err(|e| e.message)?.into_iter().map(|(t, _)| t).collect();
    let mut out = Compiled { exprs: Vec::new(), comment: None, anonymous: Vec::new() };
    let mut i = 0;
    let word = |i: usize| match toks.get(i) {
        Some(Tok::Word(w)) => Some(*w),
        _ => None,
    };
    while let Some(t) = toks.get(i) {
        let w = match t {
            Tok::Word(w) => *w,
            other => return Err(format!("unexpected {other:?}")),
        };
        match (w, word(i + 1)) {
            ("ct", Some("state")) => {
                let list = word(i + 2).ok_or("ct state without states")?;
                let mut bits = 0u32;
                for s in list.split(',') {
                    bits |= match s {
                        "invalid" => 1,
                        "established" => 2,
                        "related" => 4,
                        "new" => 8,
                        "untracked" => 64,
                        other => return Err(format!("ct state {other}")),
                    };
                }
                // The state is a host-order bit mask.
                out.exprs.extend(ct_masked(NFT_CT_STATE, bits));
                out.exprs.push(cmp(NFT_CMP_NEQ, &0u32.to_ne_bytes()));
                i += 3;
            }
            ("tcp" | "udp" | "sctp", Some("dport")) => {
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[protocol_number(w)?]));
                out.exprs.push(load(DPORT, NFT_REG_1));
                if toks.get(i + 2) == Some(&Tok::LBrace) {
                    *next_id += 1;
                    let proto_desc = match w {
                        "udp" => PROTO_DESC_UDP,
                        "tcp" => PROTO_DESC_TCP,
                        _ => PROTO_DESC_SCTP,
                    };
                    let (set, next) = port_list(&toks, i + 3, *next_id, proto_desc)?;
                    out.exprs.push(expr("lookup", |b| {
                        attr(b, NFTA_LOOKUP_SET, &nul_terminated(ANONYMOUS_SET));
                        u32_attr(b, NFTA_LOOKUP_SREG, NFT_REG_1);
                        u32_attr(b, NFTA_LOOKUP_SET_ID, set.id);
                    }));
                    out.anonymous.push(set);
                    i = next;
                    continue;
                }
                let value = word(i + 2).ok_or_else(|| format!("{w} dport without a port (or a set of ports)"))?;
                match value.split_once('-') {
                    None => out.exprs.push(cmp(NFT_CMP_EQ, &port(value)?.to_be_bytes())),
                    Some((lo, hi)) => {
                        out.exprs.push(cmp(NFT_CMP_GTE, &port(lo)?.to_be_bytes()));
                        out.exprs.push(cmp(NFT_CMP_LTE, &port(hi)?.to_be_bytes()));
                    }
                }
                i += 3;
            }
            ("ct" | "meta", Some("mark")) if word(i + 2) == Some("set") => {
                // `ct mark set ct mark | BIT`, `meta mark set meta mark | BIT`.
                if (word(i + 3), word(i + 4), word(i + 5)) != (Some(w), Some("mark"), Some("|")) {
                    return Err(format!("{w} mark set other than {w} mark | BIT"));
                }
                out.exprs.extend(mark_or(w == "ct", mark_value(word(i + 6))?));
                i += 7;
            }
            ("meta", Some("mark")) => {
                // `meta mark & BIT == BIT`.
                let bit = word(i + 3);
                if word(i + 2) != Some("&") || word(i + 4) != Some("==") || word(i + 5) != bit {
                    return Err("meta mark other than & BIT == BIT".into());
                }
                let v = mark_value(bit)?;
                out.exprs.extend(masked(load(Field::Meta { key: NFT_META_MARK, len: 4 }, NFT_REG_1), v));
                out.exprs.push(cmp(NFT_CMP_EQ, &v.to_ne_bytes()));
                i += 6;
            }
            ("tproxy", Some("to")) => {
                // `tproxy to :PORT` (both families, the address kept): the port in a register.
                let p = word(i + 2).and_then(|p| p.strip_prefix(':')).ok_or("tproxy to other than :PORT")?;
                let p = port(p)?;
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &p.to_be_bytes()));
                }));
                out.exprs.push(expr("tproxy", |b| {
                    u32_attr(b, NFTA_TPROXY_FAMILY, 0);
                    u32_attr(b, NFTA_TPROXY_REG_PORT, NFT_REG_1);
                }));
                i += 3;
            }
            ("tproxy", Some(fam @ ("ip" | "ip6"))) if word(i + 2) == Some("to") => {
                // `tproxy ip to ADDR:PORT`, `tproxy ip6 to [ADDR]:PORT`: one family (a packet of
                // the other does not match), the address in register 1, the port in 2.
                let target = word(i + 3).ok_or("tproxy to without an address")?;
                let (addr, p) = target.rsplit_once(':').ok_or_else(|| format!("tproxy to {target}: no port"))?;
                let addr = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(addr);
                let addr: std::net::IpAddr = addr.parse().map_err(|_| format!("tproxy to {target}: not an address"))?;
                if addr.is_ipv6() != (fam == "ip6") {
                    return Err(format!("tproxy {fam} to {target}: another family"));
                }
                let (family, bytes) = match addr {
                    std::net::IpAddr::V4(a) => (NFPROTO_IPV4, a.octets().to_vec()),
                    std::net::IpAddr::V6(a) => (NFPROTO_IPV6, a.octets().to_vec()),
                };
                let p = port(p)?;
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &bytes));
                }));
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1 + 1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &p.to_be_bytes()));
                }));
                out.exprs.push(expr("tproxy", |b| {
                    u32_attr(b, NFTA_TPROXY_FAMILY, u32::from(family));
                    u32_attr(b, NFTA_TPROXY_REG_ADDR, NFT_REG_1);
                    u32_attr(b, NFTA_TPROXY_REG_PORT, NFT_REG_1 + 1);
                }));
                i += 4;
            }
            ("ct", Some("direction")) => {
                // `ct direction original|reply`.
                let d: u8 = match word(i + 2) {
                    Some("original") => 0,
                    Some("reply") => 1,
                    other => return Err(format!("ct direction {other:?}")),
                };
                out.exprs.push(expr("ct", |b| {
                    u32_attr(b, NFTA_CT_DREG, NFT_REG_1);
                    u32_attr(b, NFTA_CT_KEY, NFT_CT_DIRECTION);
                }));
                out.exprs.push(cmp(NFT_CMP_EQ, &[d]));
                i += 3;
            }
            ("ct", Some("mark")) => {
                // `ct mark & BIT == BIT`: a host-order value, like the state.
                let bit = word(i + 3).ok_or("ct mark & without a value")?;
                if word(i + 2) != Some("&") || word(i + 4) != Some("==") || word(i + 5) != Some(bit) {
                    return Err("ct mark other than & BIT == BIT".into());
                }
                let v = bit.strip_prefix("0x").and_then(|h| u32::from_str_radix(h, 16).ok()).ok_or_else(|| format!("ct mark {bit}"))?;
                out.exprs.extend(ct_masked(NFT_CT_MARK, v));
                out.exprs.push(cmp(NFT_CMP_EQ, &v.to_ne_bytes()));
                i += 6;
            }
            ("icmpv6", Some("type")) => {
                // `icmpv6 type NAME`: the family, the protocol, then the type (the first byte
                // of the ICMPv6 header).
                let t = word(i + 2).ok_or("icmpv6 type without a type")?;
                out.exprs.push(load(Field::Meta { key: NFT_META_NFPROTO, len: 1 }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[NFPROTO_IPV6]));
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[protocol_number("icmpv6")?]));
                out.exprs.push(load(Field::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 0, len: 1, family: None }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[icmpv6_type(t)?]));
                i += 3;
            }
            ("reject", Some("with")) => {
                if (word(i + 2), word(i + 3)) != (Some("tcp"), Some("reset")) {
                    return Err("reject other than with tcp reset".into());
                }
                out.exprs.push(expr("reject", |b| {
                    u32_attr(b, NFTA_REJECT_TYPE, NFT_REJECT_TCP_RST);
                    attr(b, NFTA_REJECT_ICMP_CODE, &[0]);
                }));
                i += 4;
            }
            ("meta", Some("l4proto")) if word(i + 2).is_some_and(|n| n != "." && !n.starts_with('@') && n != "!=" && n != "vmap") => {
                let p = word(i + 2).unwrap_or_default();
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[protocol_number(p)?]));
                i += 3;
            }
            ("counter", _) => {
                out.exprs.push(expr("counter", |_| {}));
                i += 1;
            }
            ("limit", Some("rate")) => {
                // `limit rate N/second [burst M packets]` (nft's default burst: 5).
                let rate = word(i + 2).and_then(|r| r.strip_suffix("/second")).ok_or("limit rate without N/second")?;
                let rate: u64 = rate.parse().map_err(|_| format!("limit rate {rate}"))?;
                i += 3;
                let mut burst = 5u32;
                if word(i) == Some("burst") {
                    let b = word(i + 1).ok_or("limit burst without a number")?;
                    burst = b.parse().map_err(|_| format!("limit burst {b}"))?;
                    if word(i + 2) != Some("packets") {
                        return Err("limit burst in anything but packets".into());
                    }
                    i += 3;
                }
                out.exprs.push(expr("limit", |b| {
                    attr(b, NFTA_LIMIT_RATE, &rate.to_be_bytes());
                    attr(b, NFTA_LIMIT_UNIT, &1u64.to_be_bytes());
                    u32_attr(b, NFTA_LIMIT_BURST, burst);
                    u32_attr(b, NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS);
                    u32_attr(b, NFTA_LIMIT_FLAGS, 0);
                }));
            }
            ("log", _) => {
                // `log [prefix "P"] group G` (NFLOG; flock logs to a group only).
                i += 1;
                let mut prefix = None;
                if word(i) == Some("prefix") {
                    let Some(Tok::Str(p)) = toks.get(i + 1) else { return Err("log prefix without a string".into()) };
                    prefix = Some(*p);
                    i += 2;
                }
                if word(i) != Some("group") {
                    return Err("log without a group".into());
                }
                let g = word(i + 1).ok_or("log group without a number")?;
                let group: u16 = g.parse().map_err(|_| format!("log group {g}"))?;
                i += 2;
                out.exprs.push(expr("log", |b| {
                    if let Some(p) = prefix {
                        attr(b, NFTA_LOG_PREFIX, &nul_terminated(p));
                    }
                    attr(b, NFTA_LOG_GROUP, &group.to_be_bytes());
                }));
            }
            ("accept" | "drop" | "return" | "continue", _) => {
                out.exprs.push(immediate(w)?);
                i += 1;
            }
            ("jump" | "goto", Some(chain)) => {
                out.exprs.push(immediate(&format!("{w} {chain}"))?);
                i += 2;
            }
            ("comment", _) => {
                let Some(Tok::Str(c)) = toks.get(i + 1) else { return Err("comment without a string".into()) };
                out.comment = Some((*c).to_string());
                i += 2;
            }
            _ => i = match_fields(&toks, i, sets, &mut out.exprs)?,
        }
    }
    Ok(out)
}

/// The ICMPv6 types flock's rules name, by nft's names.
fn icmpv6_type(name: &str) -> Result<u8, String> {
    Ok(match name {
        "mld-listener-report" => 131,
        "nd-router-solicit" => 133,
        "nd-neighbor-solicit" => 135,
        "nd-neighbor-advert" => 136,
        "mld2-listener-report" => 143,
        other => return Err(format!("icmpv6 type {other}")),
    })
}

fn port(p: &str) -> Result<u16, String> {
    p.parse().map_err(|_| format!("port {p}"))
}

/// The set of ports `{ 80, 443, 8000-8080 }` from the token after `{` — sorted, and with a
/// range among them an interval set, merged as nft merges them — and the index after `}`.
fn port_list(toks: &[Tok<'_>], mut i: usize, id: u32, proto_desc: u32) -> Result<(Anonymous, usize), String> {
    let mut ranges = Vec::new();
    loop {
        match toks.get(i) {
            Some(Tok::Word(w)) => {
                ranges.push(match w.split_once('-') {
                    None => (port(w)?, port(w)?),
                    Some((lo, hi)) => (port(lo)?, port(hi)?),
                });
                i += 1;
            }
            Some(Tok::Comma) => i += 1,
            Some(Tok::RBrace) => break,
            other => return Err(format!("unexpected {other:?} in a set of ports")),
        }
    }
    if ranges.iter().any(|(a, b)| a > b) || ranges.is_empty() {
        return Err("an empty range of ports".into());
    }
    ranges.sort_unstable();
    ranges.dedup();
    // With a range among them the set is an interval set, whose elements nft merges where
    // they overlap or touch; single ports stay as they are.
    let interval = ranges.iter().any(|(a, b)| a != b);
    if interval {
        let mut merged: Vec<(u16, u16)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        ranges = merged;
    }
    Ok((Anonymous { id, proto_desc, ranges, interval }, i + 1))
}

fn immediate(verdict: &str) -> Result<Vec<u8>, String> {
    let data = verdict_data(verdict)?;
    Ok(expr("immediate", |b| {
        u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
        nested(b, NFTA_IMMEDIATE_DATA, |d| d.extend_from_slice(&data));
    }))
}

/// The field `toks[i..]` starts with, and the tokens it takes.
fn field(toks: &[Tok<'_>], i: usize) -> Option<(Field, usize)> {
    let w = |k: usize| match toks.get(i + k) {
        Some(Tok::Word(w)) => Some(*w),
        _ => None,
    };
    let addr = |family, offset, len| Field::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len, family: Some(family) };
    Some(match (w(0)?, w(1)) {
        ("iifname", _) => (Field::Meta { key: NFT_META_IIFNAME, len: 16 }, 1),
        ("oifname", _) => (Field::Meta { key: NFT_META_OIFNAME, len: 16 }, 1),
        ("ip", Some("saddr")) => (addr(NFPROTO_IPV4, 12, 4), 2),
        ("ip", Some("daddr")) => (addr(NFPROTO_IPV4, 16, 4), 2),
        ("ip6", Some("saddr")) => (addr(NFPROTO_IPV6, 8, 16), 2),
        ("ip6", Some("daddr")) => (addr(NFPROTO_IPV6, 24, 16), 2),
        ("meta", Some("l4proto")) => (L4PROTO, 2),
        ("th", Some("dport")) => (DPORT, 2),
        _ => return None,
    })
}

/// A field or a concatenation of fields, and what it is matched against: a named set or
/// verdict map, or (one interface name field) a name prefix. Returns the next token's index.
fn match_fields(toks: &[Tok<'_>], mut i: usize, sets: &HashMap<&str, SetRef<'_>>, exprs: &mut Vec<Vec<u8>>) -> Result<usize, String> {
    let mut fields = Vec::new();
    loop {
        let (f, n) = field(toks, i).ok_or_else(|| format!("unexpected {:?}", toks.get(i)))?;
        fields.push(f);
        i += n;
        if toks.get(i) != Some(&Tok::Word(".")) {
            break;
        }
        i += 1;
    }
    let (inverted, vmap) = match toks.get(i) {
        Some(Tok::Word("!=")) => (true, false),
        Some(Tok::Word("vmap")) => (false, true),
        _ => (false, false),
    };
    if inverted || vmap {
        i += 1;
    }
    let target = match toks.get(i) {
        Some(Tok::Word(w)) if w.starts_with('@') => &w[1..],
        Some(Tok::Str(name)) if fields.len() == 1 && !inverted && !vmap && matches!(fields[0], Field::Meta { len: 16, .. }) => {
            // An interface name prefix (`"flk*"`): compared over the prefix's bytes.
            let prefix = name.strip_suffix('*').ok_or_else(|| format!("interface name {name} without a wildcard"))?;
            exprs.push(load(fields[0], NFT_REG_1));
            exprs.push(cmp(NFT_CMP_EQ, prefix.as_bytes()));
            return Ok(i + 1);
        }
        other => return Err(format!("expected a set after the match, found {other:?}")),
    };
    let set = sets.get(target).ok_or_else(|| format!("set {target} is not in the table"))?;
    // The family of an address comes first.
    let mut families = fields.iter().filter_map(|f| if let Field::Payload { family: Some(fam), .. } = f { Some(*fam) } else { None });
    if let Some(fam) = families.next() {
        if families.any(|other| other != fam) {
            return Err("addresses of two families in one match".into());
        }
        exprs.push(load(Field::Meta { key: NFT_META_NFPROTO, len: 1 }, NFT_REG_1));
        exprs.push(cmp(NFT_CMP_EQ, &[fam]));
    }
    let interval_concat = set.set.interval && fields.len() > 1;
    let mut slot = 0;
    for f in &fields {
        let reg = register(slot);
        exprs.push(load(*f, reg));
        if interval_concat && matches!(f, Field::Meta { key: NFT_META_L4PROTO, .. }) {
            exprs.push(expr("byteorder", |b| {
                u32_attr(b, NFTA_BYTEORDER_SREG, reg);
                u32_attr(b, NFTA_BYTEORDER_DREG, reg);
                u32_attr(b, NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON);
                u32_attr(b, NFTA_BYTEORDER_LEN, 1);
                u32_attr(b, NFTA_BYTEORDER_SIZE, 2);
            }));
        }
        slot += f.len().div_ceil(4);
    }
    exprs.push(expr("lookup", |b| {
        attr(b, NFTA_LOOKUP_SET, &nul_terminated(target));
        u32_attr(b, NFTA_LOOKUP_SREG, NFT_REG_1);
        if vmap {
            u32_attr(b, NFTA_LOOKUP_DREG, NFT_REG_VERDICT);
        }
        // Sets declared in this batch are also found by their id; others by name alone.
        if set.id != 0 {
            u32_attr(b, NFTA_LOOKUP_SET_ID, set.id);
        }
        if inverted {
            u32_attr(b, NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
        }
    }));
    Ok(i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_of_a_concatenation() {
        // ipv6 . l4proto . port: 16 bytes from register 1, then 32-bit registers 4 and 5.
        assert_eq!([register(0), register(4), register(5)], [1, 2, 13]);
        // ipv4 . l4proto . port.
        assert_eq!([register(0), register(1), register(2)], [1, 9, 10]);
    }

    #[test]
    fn rules_outside_the_grammar_are_refused() {
        let sets = HashMap::new();
        let mut id = 0;
        for r in ["ip saddr 198.18.0.1 accept", "tcp dport { 80, 90-85 } accept", "ip saddr @missing accept", "log prefix \"x\" drop"] {
            assert!(compile(r, &sets, &mut id).is_err(), "{r}");
        }
        let c = compile("ct state established,related accept comment \"c\"", &sets, &mut id).unwrap();
        assert_eq!((c.exprs.len(), c.comment.as_deref()), (4, Some("c")));
    }

    #[test]
    fn port_sets_are_anonymous_sets_merged_as_nft_merges_them() {
        let mut id = 3;
        let c = compile("tcp dport { 443, 80, 81, 8000-8080, 8050-8090 } accept", &HashMap::new(), &mut id).unwrap();
        let [a] = &c.anonymous[..] else { panic!("one anonymous set") };
        assert_eq!((a.id, a.interval, a.proto_desc), (4, true, PROTO_DESC_TCP));
        assert_eq!(a.ranges, [(80, 81), (443, 443), (8000, 8090)]);
        let c = compile("udp dport { 5353, 53, 54 } accept", &HashMap::new(), &mut id).unwrap();
        assert!(!c.anonymous[0].interval);
        assert_eq!(c.anonymous[0].ranges, [(53, 53), (54, 54), (5353, 5353)]);
    }
}
