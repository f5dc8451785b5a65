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

use super::{NFTA_DATA_VALUE, attr, nested, nul_terminated, write_verdict};
use crate::model::Family;
use crate::render::Set;
use crate::render::rule::{CtState, Field as RuleField, Ports, Proto, Rule, Stmt};

/// ICMPv6's protocol number.
const IPPROTO_ICMPV6: u8 = 58;
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
pub(crate) const ANONYMOUS_SET: &str = "__set%d";
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
pub(crate) struct SetRef<'a> {
    pub(crate) set: &'a Set,
    pub(crate) id: u32,
}

/// A rule's expressions (each the content of an `NFTA_LIST_ELEM`), comment, and the
/// anonymous sets its expressions look up (declared in the batch before the rule).
pub(crate) struct Compiled {
    pub(crate) exprs: Vec<Vec<u8>>,
    pub(crate) comment: Option<String>,
    pub(crate) anonymous: Vec<Anonymous>,
}

/// A set of ports written in the rule (`tcp dport { 80, 443, 8000-8080 }`): nft makes it an
/// anonymous, constant set of the rule, an interval set when a range is among them.
pub(crate) struct Anonymous {
    pub(crate) id: u32,
    /// nft's id of the protocol header (`PROTO_DESC_*`) the ports are read from.
    pub(crate) proto_desc: u32,
    /// Inclusive ranges, sorted, adjacent ones merged (nft merges them).
    pub(crate) ranges: Vec<(u16, u16)>,
    pub(crate) interval: bool,
}

/// How a field a rule matches is loaded into a register.
#[derive(Clone, Copy)]
enum Load {
    Meta { key: u32, len: usize },
    Payload { base: u32, offset: u32, len: usize, family: Option<u8> },
}

impl Load {
    fn len(self) -> usize {
        match self {
            Self::Meta { len, .. } | Self::Payload { len, .. } => len,
        }
    }
}

const L4PROTO: Load = Load::Meta { key: NFT_META_L4PROTO, len: 1 };
const DPORT: Load = Load::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2, family: None };
const IIFNAME: Load = Load::Meta { key: NFT_META_IIFNAME, len: 16 };
const OIFNAME: Load = Load::Meta { key: NFT_META_OIFNAME, len: 16 };

fn expr(name: &str, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    attr(&mut out, NFTA_EXPR_NAME, &nul_terminated(name));
    nested(&mut out, NFTA_EXPR_DATA, fill);
    out
}

/// `limit rate R/second burst B packets`: a rule's statement, or a set's limit on each of its
/// elements.
pub(super) fn limit(rate: u32, burst: u32) -> Vec<u8> {
    expr("limit", |b| {
        attr(b, NFTA_LIMIT_RATE, &u64::from(rate).to_be_bytes());
        attr(b, NFTA_LIMIT_UNIT, &1u64.to_be_bytes());
        u32_attr(b, NFTA_LIMIT_BURST, burst);
        u32_attr(b, NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS);
        u32_attr(b, NFTA_LIMIT_FLAGS, 0);
    })
}

fn u32_attr(out: &mut Vec<u8>, ty: u16, v: u32) {
    attr(out, ty, &v.to_be_bytes());
}

fn load(field: Load, reg: u32) -> Vec<u8> {
    match field {
        Load::Meta { key, .. } => expr("meta", |b| {
            u32_attr(b, NFTA_META_DREG, reg);
            u32_attr(b, NFTA_META_KEY, key);
        }),
        Load::Payload { base, offset, len, .. } => expr("payload", |b| {
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

/// The register a part starting at 32-bit register `slot` is loaded into.
fn register(slot: usize) -> u32 {
    let slot = slot as u32;
    if slot.is_multiple_of(4) { NFT_REG_1 + slot / 4 } else { NFT_REG32_00 + slot }
}

/// Compiles one rule as the renderer built it; `sets` are the named sets it may look up,
/// `next_id` the batch's next set id (taken by the rule's anonymous sets).
pub(super) fn compile(rule: &Rule, sets: &HashMap<&str, SetRef<'_>>, next_id: &mut u32) -> Result<Compiled, String> {
    let mut out = Compiled { exprs: Vec::new(), comment: rule.comment.clone(), anonymous: Vec::new() };
    // Whether an earlier statement established that the packet is IPv6 (`icmpv6 type`): nft
    // then loads `ip6` fields without checking the family again.
    let mut ipv6 = false;
    for stmt in &rule.stmts {
        match stmt {
            Stmt::CtState(states) => {
                let bits = states.iter().fold(0u32, |b, s| {
                    b | match s {
                        CtState::Invalid => 1,
                        CtState::Established => 2,
                        CtState::Related => 4,
                        CtState::New => 8,
                    }
                });
                // The state is a host-order bit mask.
                out.exprs.extend(ct_masked(NFT_CT_STATE, bits));
                out.exprs.push(cmp(NFT_CMP_NEQ, &0u32.to_ne_bytes()));
            }
            Stmt::CtReply(reply) => {
                out.exprs.push(expr("ct", |b| {
                    u32_attr(b, NFTA_CT_DREG, NFT_REG_1);
                    u32_attr(b, NFTA_CT_KEY, NFT_CT_DIRECTION);
                }));
                out.exprs.push(cmp(NFT_CMP_EQ, &[u8::from(*reply)]));
            }
            Stmt::MarkBit { ct: true, bit } => {
                // A host-order value, like the state.
                out.exprs.extend(ct_masked(NFT_CT_MARK, *bit));
                out.exprs.push(cmp(NFT_CMP_EQ, &bit.to_ne_bytes()));
            }
            Stmt::MarkBit { ct: false, bit } => {
                out.exprs.extend(masked(load(Load::Meta { key: NFT_META_MARK, len: 4 }, NFT_REG_1), *bit));
                out.exprs.push(cmp(NFT_CMP_EQ, &bit.to_ne_bytes()));
            }
            Stmt::SetMarkBit { ct, bit } => out.exprs.extend(mark_or(*ct, *bit)),
            Stmt::L4Proto(p) => {
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[p.number()]));
            }
            Stmt::Dport(p, ports) => {
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[p.number()]));
                out.exprs.push(load(DPORT, NFT_REG_1));
                match ports {
                    Ports::One(n) => out.exprs.push(cmp(NFT_CMP_EQ, &n.to_be_bytes())),
                    Ports::Range(lo, hi) => {
                        out.exprs.push(cmp(NFT_CMP_GTE, &lo.to_be_bytes()));
                        out.exprs.push(cmp(NFT_CMP_LTE, &hi.to_be_bytes()));
                    }
                    Ports::Set(ranges) => {
                        *next_id += 1;
                        let proto_desc = match p {
                            Proto::Udp => PROTO_DESC_UDP,
                            Proto::Tcp => PROTO_DESC_TCP,
                            Proto::Sctp => PROTO_DESC_SCTP,
                        };
                        let set = port_set(ranges, *next_id, proto_desc)?;
                        out.exprs.push(expr("lookup", |b| {
                            attr(b, NFTA_LOOKUP_SET, &nul_terminated(ANONYMOUS_SET));
                            u32_attr(b, NFTA_LOOKUP_SREG, NFT_REG_1);
                            u32_attr(b, NFTA_LOOKUP_SET_ID, set.id);
                        }));
                        out.anonymous.push(set);
                    }
                }
            }
            Stmt::IfName { out: o, neg, name } => {
                // An interface name prefix (`"flk*"`): compared over the prefix's bytes.
                let prefix = name.strip_suffix('*').ok_or_else(|| format!("interface name {name} without a wildcard"))?;
                out.exprs.push(load(if *o { OIFNAME } else { IIFNAME }, NFT_REG_1));
                out.exprs.push(cmp(if *neg { NFT_CMP_NEQ } else { NFT_CMP_EQ }, prefix.as_bytes()));
            }
            Stmt::Lookup { fields, neg, set } => lookup(fields, *neg, false, set, sets, ipv6, &mut out.exprs)?,
            Stmt::Vmap { fields, map } => lookup(fields, false, true, map, sets, ipv6, &mut out.exprs)?,
            Stmt::InnerEtherType(fam) => {
                let offset = crate::render::rule::INNER_ETHERTYPE / 8;
                out.exprs.push(load(Load::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset, len: 2, family: None }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &RuleField::ethertype(*fam).to_be_bytes()));
            }
            Stmt::IcmpV6Type(t) => {
                // The family, the protocol, then the type (the first byte of the ICMPv6 header).
                out.exprs.push(load(Load::Meta { key: NFT_META_NFPROTO, len: 1 }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[NFPROTO_IPV6]));
                out.exprs.push(load(L4PROTO, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[IPPROTO_ICMPV6]));
                out.exprs.push(load(Load::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 0, len: 1, family: None }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[t.number()]));
                ipv6 = true;
            }
            Stmt::HopLimit(n) => {
                if !std::mem::replace(&mut ipv6, true) {
                    out.exprs.push(load(Load::Meta { key: NFT_META_NFPROTO, len: 1 }, NFT_REG_1));
                    out.exprs.push(cmp(NFT_CMP_EQ, &[NFPROTO_IPV6]));
                }
                out.exprs.push(load(Load::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset: 7, len: 1, family: None }, NFT_REG_1));
                out.exprs.push(cmp(NFT_CMP_EQ, &[*n]));
            }
            Stmt::Counter => out.exprs.push(expr("counter", |_| {})),
            Stmt::Limit { rate, burst } => out.exprs.push(limit(*rate, *burst)),
            Stmt::Log { prefix, group } => {
                out.exprs.push(expr("log", |b| {
                    if let Some(p) = prefix {
                        attr(b, NFTA_LOG_PREFIX, &nul_terminated(p));
                    }
                    attr(b, NFTA_LOG_GROUP, &group.to_be_bytes());
                }));
            }
            Stmt::Tproxy { addr: None, port } => {
                // Both families, the address kept: the port in a register.
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &port.to_be_bytes()));
                }));
                out.exprs.push(expr("tproxy", |b| {
                    u32_attr(b, NFTA_TPROXY_FAMILY, 0);
                    u32_attr(b, NFTA_TPROXY_REG_PORT, NFT_REG_1);
                }));
            }
            Stmt::Tproxy { addr: Some(addr), port } => {
                // One family (a packet of the other does not match): the address in register
                // 1, the port in 2.
                let (family, bytes) = match addr {
                    std::net::IpAddr::V4(a) => (NFPROTO_IPV4, a.octets().to_vec()),
                    std::net::IpAddr::V6(a) => (NFPROTO_IPV6, a.octets().to_vec()),
                };
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &bytes));
                }));
                out.exprs.push(expr("immediate", |b| {
                    u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_1 + 1);
                    nested(b, NFTA_IMMEDIATE_DATA, |d| attr(d, NFTA_DATA_VALUE, &port.to_be_bytes()));
                }));
                out.exprs.push(expr("tproxy", |b| {
                    u32_attr(b, NFTA_TPROXY_FAMILY, u32::from(family));
                    u32_attr(b, NFTA_TPROXY_REG_ADDR, NFT_REG_1);
                    u32_attr(b, NFTA_TPROXY_REG_PORT, NFT_REG_1 + 1);
                }));
            }
            Stmt::RejectTcpReset => out.exprs.push(expr("reject", |b| {
                u32_attr(b, NFTA_REJECT_TYPE, NFT_REJECT_TCP_RST);
                attr(b, NFTA_REJECT_ICMP_CODE, &[0]);
            })),
        }
    }
    if let Some(v) = &rule.verdict {
        out.exprs.push(expr("immediate", |b| {
            u32_attr(b, NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            nested(b, NFTA_IMMEDIATE_DATA, |d| write_verdict(v, d));
        }));
    }
    Ok(out)
}

/// A set of ports written in the rule, as nft makes it: sorted, and with a range among them
/// an interval set, merged as nft merges them.
fn port_set(ranges: &[(u16, u16)], id: u32, proto_desc: u32) -> Result<Anonymous, String> {
    if ranges.iter().any(|(a, b)| a > b) || ranges.is_empty() {
        return Err("an empty range of ports".into());
    }
    let mut ranges = ranges.to_vec();
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
    Ok(Anonymous { id, proto_desc, ranges, interval })
}

/// The load of a field a rule matches.
fn field(f: RuleField) -> Load {
    let addr = |family, offset, len| Load::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len, family: Some(family) };
    match f {
        RuleField::IifName => IIFNAME,
        RuleField::OifName => OIFNAME,
        RuleField::Saddr(Family::V4) => addr(NFPROTO_IPV4, 12, 4),
        RuleField::Daddr(Family::V4) => addr(NFPROTO_IPV4, 16, 4),
        RuleField::Saddr(Family::V6) => addr(NFPROTO_IPV6, 8, 16),
        RuleField::Daddr(Family::V6) => addr(NFPROTO_IPV6, 24, 16),
        RuleField::L4Proto => L4PROTO,
        RuleField::ThDport => DPORT,
        RuleField::InnerSaddr(fam) => {
            let (offset, len) = RuleField::inner_saddr(fam);
            Load::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: offset / 8, len: len as usize / 8, family: None }
        }
    }
}

/// A field or a concatenation of fields looked up in named set `target` (inverted with
/// `neg`), or in verdict map `target` (`vmap`).
fn lookup(
    fields: &[RuleField],
    neg: bool,
    vmap: bool,
    target: &str,
    sets: &HashMap<&str, SetRef<'_>>,
    ipv6: bool,
    exprs: &mut Vec<Vec<u8>>,
) -> Result<(), String> {
    let fields: Vec<Load> = fields.iter().map(|f| field(*f)).collect();
    let set = sets.get(target).ok_or_else(|| format!("set {target} is not in the table"))?;
    // The family of an address comes first.
    let mut families = fields.iter().filter_map(|f| if let Load::Payload { family: Some(fam), .. } = f { Some(*fam) } else { None });
    if let Some(fam) = families.next() {
        if families.any(|other| other != fam) {
            return Err("addresses of two families in one match".into());
        }
        // Unless the rule established it already (IPv6 after `icmpv6 type`), as nft does.
        if !(ipv6 && fam == NFPROTO_IPV6) {
            exprs.push(load(Load::Meta { key: NFT_META_NFPROTO, len: 1 }, NFT_REG_1));
            exprs.push(cmp(NFT_CMP_EQ, &[fam]));
        }
    }
    let interval_concat = set.set.interval && fields.len() > 1;
    let mut slot = 0;
    for f in &fields {
        let reg = register(slot);
        exprs.push(load(*f, reg));
        if interval_concat && matches!(f, Load::Meta { key: NFT_META_L4PROTO, .. }) {
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
        if neg {
            u32_attr(b, NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
        }
    }));
    Ok(())
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
    fn what_the_kernel_cannot_take_is_refused() {
        let sets = HashMap::new();
        let mut id = 0;
        let lookup = Rule::new(vec![Stmt::Lookup { fields: vec![RuleField::Saddr(Family::V4)], neg: false, set: "missing".into() }], None);
        let backwards = Rule::new(vec![Stmt::Dport(Proto::Tcp, Ports::Set(vec![(80, 80), (90, 85)]))], None);
        let no_wildcard = Rule::new(vec![Stmt::IfName { out: false, neg: false, name: "eth0".into() }], None);
        for r in [lookup, backwards, no_wildcard] {
            assert!(compile(&r, &sets, &mut id).is_err(), "{r}");
        }
        let r = Rule::new(vec![Stmt::CtState(vec![CtState::Established, CtState::Related])], Some(crate::render::rule::Verdict::Accept))
            .comment("c");
        let c = compile(&r, &sets, &mut id).unwrap();
        assert_eq!((c.exprs.len(), c.comment.as_deref()), (4, Some("c")));
    }

    #[test]
    fn port_sets_are_anonymous_sets_merged_as_nft_merges_them() {
        let mut id = 3;
        let ports = |p, r: &[(u16, u16)]| Rule::new(vec![Stmt::Dport(p, Ports::Set(r.to_vec()))], None);
        let c =
            compile(&ports(Proto::Tcp, &[(443, 443), (80, 80), (81, 81), (8000, 8080), (8050, 8090)]), &HashMap::new(), &mut id).unwrap();
        let [a] = &c.anonymous[..] else { panic!("one anonymous set") };
        assert_eq!((a.id, a.interval, a.proto_desc), (4, true, PROTO_DESC_TCP));
        assert_eq!(a.ranges, [(80, 81), (443, 443), (8000, 8090)]);
        let c = compile(&ports(Proto::Udp, &[(5353, 5353), (53, 53), (54, 54)]), &HashMap::new(), &mut id).unwrap();
        assert!(!c.anonymous[0].interval);
        assert_eq!(c.anonymous[0].ranges, [(53, 53), (54, 54), (5353, 5353)]);
    }
}
