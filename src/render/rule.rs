//! A rule as the renderer builds it: typed statements, a verdict and a comment. One printer
//! ([`fmt::Display`]) writes it as nft text, exactly as `nft list` prints it back (the
//! goldens, `flockctl render`, `--nft-transactions`); one encoder
//! (`crate::apply::netlink::rule`) turns the same value into netlink expressions. Nothing
//! re-reads what flock printed to learn what a rule means: its meaning is this type.
//!
//! The statements are exactly those flock writes, no more: a rule the type cannot express is
//! a rule flock does not render.

use std::fmt;
use std::net::IpAddr;

use crate::model::Family;

/// The payload protocol of an address match: `ip` or `ip6`.
fn payload(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// A packet field a rule matches or looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    IifName,
    OifName,
    Saddr(Family),
    Daddr(Family),
    /// `meta l4proto`
    L4Proto,
    /// `th dport`: the destination port of any transport header.
    ThDport,
    /// The source address of the IP packet inside a VXLAN frame, read raw from the UDP
    /// header on: `@th,336,32` (IPv4), `@th,304,128` (IPv6). See [`INNER_ETHERTYPE`].
    InnerSaddr(Family),
}

/// Offsets into a VXLAN packet from the start of its UDP header, in bits: UDP (8 bytes),
/// VXLAN (8), the inner Ethernet header's addresses (12), its EtherType (2), then the inner
/// IP header, whose source is 12 bytes in (IPv4) or 8 (IPv6).
pub(crate) const INNER_ETHERTYPE: u32 = 28 * 8;
const INNER_IP: u32 = 30 * 8;

/// `typeof` key parts (a set's key when one of its fields is a raw payload): the outer source
/// and the inner one, per family, written as [`Field::Saddr`] and [`Field::InnerSaddr`]
/// print them (a test holds them equal). The netlink writer matches on these.
pub(crate) const TYPEOF_SADDR_V4: &str = "ip saddr";
pub(crate) const TYPEOF_SADDR_V6: &str = "ip6 saddr";
pub(crate) const TYPEOF_INNER_SADDR_V4: &str = "@th,336,32";
pub(crate) const TYPEOF_INNER_SADDR_V6: &str = "@th,304,128";

impl Field {
    /// This field as a `typeof` key part, for the fields a `typeof` key may hold.
    pub(crate) fn typeof_part(self) -> Option<&'static str> {
        match self {
            Self::Saddr(Family::V4) => Some(TYPEOF_SADDR_V4),
            Self::Saddr(Family::V6) => Some(TYPEOF_SADDR_V6),
            Self::InnerSaddr(Family::V4) => Some(TYPEOF_INNER_SADDR_V4),
            Self::InnerSaddr(Family::V6) => Some(TYPEOF_INNER_SADDR_V6),
            _ => None,
        }
    }

    /// Where an inner source address lies (bits from the transport header) and its length.
    pub(crate) fn inner_saddr(family: Family) -> (u32, u32) {
        match family {
            Family::V4 => (INNER_IP + 12 * 8, 32),
            Family::V6 => (INNER_IP + 8 * 8, 128),
        }
    }

    /// The EtherType of an inner IP packet of `family`.
    pub(crate) fn ethertype(family: Family) -> u16 {
        match family {
            Family::V4 => 0x0800,
            Family::V6 => 0x86dd,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::IifName => f.write_str("iifname"),
            Self::OifName => f.write_str("oifname"),
            Self::Saddr(ip) => write!(f, "{} saddr", payload(*ip)),
            Self::Daddr(ip) => write!(f, "{} daddr", payload(*ip)),
            Self::L4Proto => f.write_str("meta l4proto"),
            Self::ThDport => f.write_str("th dport"),
            Self::InnerSaddr(fam) => {
                let (offset, len) = Self::inner_saddr(*fam);
                write!(f, "@th,{offset},{len}")
            }
        }
    }
}

/// A transport protocol, as nft names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub(crate) fn keyword(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }

    /// The IANA protocol number.
    pub(crate) fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }
}

impl From<crate::model::Protocol> for Proto {
    fn from(p: crate::model::Protocol) -> Self {
        match p {
            crate::model::Protocol::Tcp => Self::Tcp,
            crate::model::Protocol::Udp => Self::Udp,
            crate::model::Protocol::Sctp => Self::Sctp,
        }
    }
}

/// Destination ports: one, a range, or a set of ports and ranges (an anonymous set).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ports {
    One(u16),
    Range(u16, u16),
    /// Written `{ 80, 81-90 }`, in the order given.
    Set(Vec<(u16, u16)>),
}

fn port_or_range(f: &mut fmt::Formatter<'_>, (a, b): (u16, u16)) -> fmt::Result {
    if a == b { write!(f, "{a}") } else { write!(f, "{a}-{b}") }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::One(p) => write!(f, "{p}"),
            Self::Range(a, b) => port_or_range(f, (*a, *b)),
            Self::Set(ranges) => {
                f.write_str("{ ")?;
                for (i, r) in ranges.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    port_or_range(f, *r)?;
                }
                f.write_str(" }")
            }
        }
    }
}

/// A conntrack state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CtState {
    Invalid,
    Established,
    Related,
    New,
}

impl CtState {
    pub(crate) fn keyword(self) -> &'static str {
        match self {
            Self::Invalid => "invalid",
            Self::Established => "established",
            Self::Related => "related",
            Self::New => "new",
        }
    }
}

/// The ICMPv6 types flock's rules name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IcmpV6 {
    MldListenerReport,
    NdRouterSolicit,
    NdNeighborSolicit,
    NdNeighborAdvert,
    Mld2ListenerReport,
}

impl IcmpV6 {
    pub(crate) fn keyword(self) -> &'static str {
        match self {
            Self::MldListenerReport => "mld-listener-report",
            Self::NdRouterSolicit => "nd-router-solicit",
            Self::NdNeighborSolicit => "nd-neighbor-solicit",
            Self::NdNeighborAdvert => "nd-neighbor-advert",
            Self::Mld2ListenerReport => "mld2-listener-report",
        }
    }

    /// The type's number (RFC 4443, 4861, 2710, 3810).
    pub(crate) fn number(self) -> u8 {
        match self {
            Self::MldListenerReport => 131,
            Self::NdRouterSolicit => 133,
            Self::NdNeighborSolicit => 135,
            Self::NdNeighborAdvert => 136,
            Self::Mld2ListenerReport => 143,
        }
    }
}

/// One statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stmt {
    /// `ct state a,b`
    CtState(Vec<CtState>),
    /// `ct direction reply` (`true`) or `original`.
    CtReply(bool),
    /// `ct mark & BIT == BIT` (`ct`), `meta mark & BIT == BIT`.
    MarkBit {
        ct: bool,
        bit: u32,
    },
    /// `ct mark set ct mark | BIT`, `meta mark set meta mark | BIT`.
    SetMarkBit {
        ct: bool,
        bit: u32,
    },
    /// `meta l4proto P`
    L4Proto(Proto),
    /// `tcp dport PORTS`
    Dport(Proto, Ports),
    /// `iifname "flk*"`, `oifname != "flk*"` (a trailing `*` matches a prefix).
    IfName {
        out: bool,
        neg: bool,
        name: String,
    },
    /// A field or a concatenation of fields looked up in a named set: `iifname . ip saddr !=
    /// @pod-addrs-v4`.
    Lookup {
        fields: Vec<Field>,
        neg: bool,
        set: String,
    },
    /// `@th,224,16 0x800`: a VXLAN frame carries an IP packet of this family.
    InnerEtherType(Family),
    /// `icmpv6 type T`
    IcmpV6Type(IcmpV6),
    /// `ip6 hoplimit N`
    HopLimit(u8),
    Counter,
    /// `limit rate N/second burst M packets`
    Limit {
        rate: u32,
        burst: u32,
    },
    /// `log [prefix "P"] group G` (NFLOG).
    Log {
        prefix: Option<String>,
        group: u16,
    },
    /// `tproxy to :PORT` (both families, the address kept), or `tproxy ip to ADDR:PORT`.
    Tproxy {
        addr: Option<IpAddr>,
        port: u16,
    },
    /// `reject with tcp reset`
    RejectTcpReset,
    /// The field's value looked up in a verdict map, whose element gives the verdict:
    /// `oifname vmap @ingress-chains`. Last in its rule.
    Vmap {
        fields: Vec<Field>,
        map: String,
    },
}

fn mark(f: &mut fmt::Formatter<'_>, ct: bool) -> fmt::Result {
    f.write_str(if ct { "ct mark" } else { "meta mark" })
}

fn fields(f: &mut fmt::Formatter<'_>, fields: &[Field]) -> fmt::Result {
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            f.write_str(" . ")?;
        }
        write!(f, "{field}")?;
    }
    Ok(())
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CtState(states) => {
                f.write_str("ct state ")?;
                for (i, s) in states.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(s.keyword())?;
                }
                Ok(())
            }
            Self::CtReply(reply) => f.write_str(if *reply { "ct direction reply" } else { "ct direction original" }),
            Self::MarkBit { ct, bit } => {
                mark(f, *ct)?;
                write!(f, " & {bit:#010x} == {bit:#010x}")
            }
            Self::SetMarkBit { ct, bit } => {
                mark(f, *ct)?;
                f.write_str(" set ")?;
                mark(f, *ct)?;
                write!(f, " | {bit:#010x}")
            }
            Self::L4Proto(p) => write!(f, "meta l4proto {}", p.keyword()),
            Self::Dport(p, ports) => write!(f, "{} dport {ports}", p.keyword()),
            Self::IfName { out, neg, name } => {
                write!(f, "{} {}\"{name}\"", if *out { "oifname" } else { "iifname" }, if *neg { "!= " } else { "" })
            }
            Self::Lookup { fields: fs, neg, set } => {
                fields(f, fs)?;
                write!(f, " {}@{set}", if *neg { "!= " } else { "" })
            }
            Self::InnerEtherType(fam) => write!(f, "@th,{INNER_ETHERTYPE},16 {:#x}", Field::ethertype(*fam)),
            Self::IcmpV6Type(t) => write!(f, "icmpv6 type {}", t.keyword()),
            Self::HopLimit(n) => write!(f, "ip6 hoplimit {n}"),
            Self::Counter => f.write_str("counter"),
            // nft does not print its default burst, 5.
            Self::Limit { rate, burst: 5 } => write!(f, "limit rate {rate}/second"),
            Self::Limit { rate, burst } => write!(f, "limit rate {rate}/second burst {burst} packets"),
            Self::Log { prefix, group } => {
                f.write_str("log ")?;
                if let Some(p) = prefix {
                    write!(f, "prefix \"{p}\" ")?;
                }
                write!(f, "group {group}")
            }
            Self::Tproxy { addr: None, port } => write!(f, "tproxy to :{port}"),
            Self::Tproxy { addr: Some(IpAddr::V4(a)), port } => write!(f, "tproxy ip to {a}:{port}"),
            Self::Tproxy { addr: Some(IpAddr::V6(a)), port } => write!(f, "tproxy ip6 to [{a}]:{port}"),
            Self::RejectTcpReset => f.write_str("reject with tcp reset"),
            Self::Vmap { fields: fs, map } => {
                fields(f, fs)?;
                write!(f, " vmap @{map}")
            }
        }
    }
}

/// What a rule does with a packet it matches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accept => f.write_str("accept"),
            Self::Drop => f.write_str("drop"),
            Self::Return => f.write_str("return"),
            Self::Jump(c) => write!(f, "jump {c}"),
            Self::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// A rule: its statements in order, then its verdict (none: the packet goes on to the next
/// rule), then its comment. Comments are made safe by the renderer
/// (`render::names::comment`) before they get here.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    pub(crate) stmts: Vec<Stmt>,
    pub verdict: Option<Verdict>,
    pub(crate) comment: Option<String>,
}

impl Rule {
    pub(crate) fn new(stmts: Vec<Stmt>, verdict: Option<Verdict>) -> Self {
        Self { stmts, verdict, comment: None }
    }

    /// A rule of a verdict alone.
    pub fn verdict(v: Verdict) -> Self {
        Self::new(Vec::new(), Some(v))
    }

    /// With `comment` (already safe for nft).
    pub(crate) fn comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// The sets and maps the rule refers to.
    pub fn sets(&self) -> impl Iterator<Item = &str> {
        self.stmts.iter().filter_map(|s| match s {
            Stmt::Lookup { set, .. } => Some(set.as_str()),
            Stmt::Vmap { map, .. } => Some(map.as_str()),
            _ => None,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            if !std::mem::take(&mut first) {
                f.write_str(" ")?;
            }
            Ok::<(), fmt::Error>(())
        };
        for s in &self.stmts {
            sep(f)?;
            write!(f, "{s}")?;
        }
        if let Some(v) = &self.verdict {
            sep(f)?;
            write!(f, "{v}")?;
        }
        if let Some(c) = &self.comment {
            sep(f)?;
            write!(f, "comment \"{c}\"")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_print_as_nft_lists_them() {
        let r = Rule::new(
            vec![
                Stmt::Lookup { fields: vec![Field::IifName, Field::Saddr(Family::V4)], neg: true, set: "pod-addrs-v4".into() },
                Stmt::Counter,
            ],
            Some(Verdict::Goto("deny-spoofed".into())),
        )
        .comment("unknown pod interface or spoofed source address");
        assert_eq!(
            r.to_string(),
            "iifname . ip saddr != @pod-addrs-v4 counter goto deny-spoofed comment \"unknown pod interface or spoofed source address\""
        );
        let r = Rule::new(
            vec![
                Stmt::MarkBit { ct: false, bit: 0x80 },
                Stmt::L4Proto(Proto::Udp),
                Stmt::Tproxy { addr: Some("::1".parse().unwrap()), port: 15053 },
            ],
            Some(Verdict::Accept),
        );
        assert_eq!(r.to_string(), "meta mark & 0x00000080 == 0x00000080 meta l4proto udp tproxy ip6 to [::1]:15053 accept");
        let r = Rule::new(
            vec![Stmt::Dport(Proto::Tcp, Ports::Set(vec![(80, 80), (8000, 8100)])), Stmt::SetMarkBit { ct: true, bit: 0x0200_0000 }],
            None,
        );
        assert_eq!(r.to_string(), "tcp dport { 80, 8000-8100 } ct mark set ct mark | 0x02000000");
        assert_eq!(Rule::verdict(Verdict::Drop).to_string(), "drop");
        let r = Rule::new(
            vec![
                Stmt::InnerEtherType(Family::V6),
                Stmt::Lookup { fields: vec![Field::Saddr(Family::V4), Field::InnerSaddr(Family::V6)], neg: false, set: "s".into() },
            ],
            Some(Verdict::Return),
        );
        assert_eq!(r.to_string(), "@th,224,16 0x86dd ip saddr . @th,304,128 @s return");
        assert_eq!(Stmt::InnerEtherType(Family::V4).to_string(), "@th,224,16 0x800");
        assert_eq!(Field::InnerSaddr(Family::V4).to_string(), "@th,336,32");
        for fam in [Family::V4, Family::V6] {
            for field in [Field::Saddr(fam), Field::InnerSaddr(fam)] {
                assert_eq!(field.typeof_part(), Some(field.to_string().as_str()));
            }
        }
        assert_eq!(
            Rule::new(vec![Stmt::Limit { rate: 10, burst: 20 }, Stmt::Log { prefix: Some("flock:x".into()), group: 100 }], None)
                .to_string(),
            "limit rate 10/second burst 20 packets log prefix \"flock:x\" group 100"
        );
    }
}
