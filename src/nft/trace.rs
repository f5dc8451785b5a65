//! A packet tracer over an in-memory table, like kube-proxy's `nftablesTracer`: runs one
//! packet through a base chain and reports the verdict and the rules it matched.
//!
//! It understands exactly the rule shapes flock writes; any other shape is an error (a test
//! failure), never a guess. This is how tests check policy *outcomes* over the very text
//! that is sent to nft.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::parse::{self, Tok};
use super::table::Table;

/// Transport protocol of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    Tcp,
    Udp,
    Sctp,
    /// ICMP (IPv4) or ICMPv6, by the packet's family.
    Icmp,
}

impl L4 {
    fn nft_name(self, v6: bool) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
            L4::Sctp => "sctp",
            L4::Icmp if v6 => "ipv6-icmp",
            L4::Icmp => "icmp",
        }
    }
}

/// Conntrack state of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ct {
    New,
    Established,
    Related,
    Invalid,
}

/// The packet to trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub iif: String,
    pub oif: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub l4: L4,
    /// Destination port (ignored for ICMP).
    pub dport: u16,
    pub ct: Ct,
}

/// The final verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
}

/// A verdict and the rules that led to it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub verdict: Verdict,
    pub path: Vec<Step>,
}

/// A rule the packet matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub chain: String,
    pub rule: String,
    /// The comment of each set or map element the rule matched on (the pod and policy rule
    /// behind it).
    pub(crate) matched: Vec<String>,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.chain, self.rule)?;
        if !self.matched.is_empty() {
            write!(f, " [matched {}]", self.matched.join("; "))?;
        }
        Ok(())
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:?}", self.verdict)?;
        for p in &self.path {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

/// A rule the tracer does not understand, or a reference it cannot follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chain {chain}: {message}: {rule}")]
pub struct TraceError {
    pub(crate) chain: String,
    pub(crate) rule: String,
    pub(crate) message: String,
}

enum Flow {
    /// The chain ended, or `return`.
    Continue,
    Final(Verdict),
}

/// Runs `pkt` through base chain `base` of `table` (compiles the table first: to trace many
/// packets through one table, build a [`Tracer`] once).
pub fn trace(table: &Table, base: &str, pkt: &Packet) -> Result<Trace, TraceError> {
    Tracer::new(table).trace(base, pkt)
}

/// A table compiled for tracing: every rule parsed into matches and a verdict, every set
/// element into typed fields, once. Tracing a packet then only evaluates (the fuzz targets and
/// the offline conformance runner trace thousands of flows through one table).
///
/// A rule the tracer does not understand is kept with its error, which a trace reports only
/// when a packet reaches the rule: as [`trace`] always did.
#[derive(Debug, Clone)]
pub struct Tracer {
    chains: BTreeMap<String, CompiledChain>,
    sets: BTreeMap<String, CompiledSet>,
}

#[derive(Debug, Clone)]
struct CompiledChain {
    policy_drop: bool,
    rules: Vec<(String, Result<Rule, String>)>,
}

/// A rule: every match must hold, then its action.
#[derive(Debug, Clone)]
struct Rule {
    matches: Vec<Match>,
    action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Saddr,
    Daddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Iface {
    In,
    Out,
}

#[derive(Debug, Clone)]
enum Match {
    /// `ct state a,b`
    CtState(Vec<Ct>),
    /// `ct mark & BIT == BIT`, `meta mark & BIT == BIT`: marks flock sets on connections it
    /// revoked and on DNS it steers. The traced packet opens a connection and carries no
    /// mark, so these never match.
    MarkBit,
    /// `meta l4proto [!=] P`
    L4proto { neg: bool, proto: String },
    /// `meta nfproto [!=] ipv4|ipv6`
    Nfproto { neg: bool, v6: bool },
    /// `iifname|oifname [!=] "name"` (a trailing `*` matches a prefix)
    IfName { iface: Iface, neg: bool, pattern: String },
    /// `iifname|oifname @set`
    IfSet { iface: Iface, set: String },
    /// `oifname . meta l4proto . th dport @set`
    IfProtoPort { iface: Iface, set: String },
    /// `iifname . ip saddr [!=] @set`
    IfAddr { iface: Iface, v6: bool, field: Field, neg: bool, set: String },
    /// `ip daddr [!=] @set` (the element's comment names the peer)
    AddrSet { v6: bool, field: Field, neg: bool, set: String },
    /// `ip daddr [!=] 198.18.0.1` (an address, prefix or range)
    AddrLit { v6: bool, field: Field, neg: bool, range: (IpAddr, IpAddr) },
    /// `ip daddr . meta l4proto . th dport [!=] @set`
    AddrProtoPort { v6: bool, field: Field, neg: bool, set: String },
    /// `tcp|udp|sctp|th dport [!=] ports`
    Ports { proto: Option<String>, neg: bool, ranges: Vec<(u16, u16)> },
    /// `icmpv6 type { ... }`, `icmp type { ... }`: never a new TCP/UDP/SCTP flow's.
    IcmpType,
}

#[derive(Debug, Clone)]
enum Action {
    /// Matched, no verdict (e.g. a lone `counter`).
    Continue,
    Verdict(String),
    /// `iifname|oifname vmap @map`
    IfVmap {
        iface: Iface,
        map: String,
    },
    /// `ip saddr vmap @map`
    AddrVmap {
        v6: bool,
        field: Field,
        map: String,
    },
}

#[derive(Debug, Clone)]
enum Key {
    Iface(String),
    /// Inclusive range.
    Addr(IpAddr, IpAddr),
    Proto(String),
    Ports(u16, u16),
}

/// A set element: its fields (or why they do not parse), its note and verdict.
type CompiledElement = (Result<Vec<Key>, String>, String, Option<String>);

#[derive(Debug, Clone)]
struct CompiledSet {
    elements: Vec<CompiledElement>,
    /// Interface verdict maps by interface name (unquoted): their vmap lookup is by key.
    by_iface: BTreeMap<String, usize>,
}

impl Tracer {
    /// Compiles `table`.
    pub fn new(table: &Table) -> Self {
        let chains = table
            .chains
            .iter()
            .map(|(name, c)| {
                let policy_drop = c.spec.hook.as_deref().is_some_and(|h| h.contains("policy drop"));
                let rules = c.rules.iter().map(|r| (r.clone(), compile_rule(r))).collect();
                (name.clone(), CompiledChain { policy_drop, rules })
            })
            .collect();
        let sets = table
            .sets
            .iter()
            .map(|(name, s)| {
                let mut by_iface = BTreeMap::new();
                // `ifname . ipv4_addr`, `ipv4_addr : verdict`: the key's field types.
                let key_type = s.spec.type_.split(" : ").next().unwrap_or_default();
                let types: Vec<&str> = key_type.split(" . ").collect();
                let elements = s
                    .elements
                    .iter()
                    .enumerate()
                    .map(|(i, (key, e))| {
                        let parts: Vec<&str> = key.split(" . ").collect();
                        let keys = if parts.len() == types.len() {
                            parts
                                .iter()
                                .zip(&types)
                                .map(|(part, ty)| parse_key(ty, part).ok_or_else(|| format!("bad {ty} {part} in {name}")))
                                .collect::<Result<Vec<Key>, String>>()
                        } else {
                            Err(format!("element {key} of {name} does not have the {} fields of {key_type}", types.len()))
                        };
                        if let Ok([Key::Iface(iface)]) = keys.as_deref() {
                            by_iface.insert(iface.clone(), i);
                        }
                        (keys, e.note(), e.verdict.clone())
                    })
                    .collect();
                (name.clone(), CompiledSet { elements, by_iface })
            })
            .collect();
        Self { chains, sets }
    }

    /// Runs `pkt` through base chain `base`.
    pub fn trace(&self, base: &str, pkt: &Packet) -> Result<Trace, TraceError> {
        let mut path = Vec::new();
        let chain =
            self.chains.get(base).ok_or_else(|| TraceError { chain: base.into(), rule: String::new(), message: "no such chain".into() })?;
        let verdict = match self.run_chain(base, pkt, &mut path, 0)? {
            Flow::Final(v) => v,
            Flow::Continue if chain.policy_drop => Verdict::Drop,
            Flow::Continue => Verdict::Accept,
        };
        Ok(Trace { verdict, path })
    }

    fn run_chain(&self, name: &str, pkt: &Packet, path: &mut Vec<Step>, depth: usize) -> Result<Flow, TraceError> {
        let err = |rule: &str, message: String| TraceError { chain: name.into(), rule: rule.into(), message };
        if depth > 16 {
            return Err(err("", "jump depth exceeded (a loop?)".into()));
        }
        let chain = self.chains.get(name).ok_or_else(|| err("", "no such chain".into()))?;
        for (text, rule) in &chain.rules {
            let rule = rule.as_ref().map_err(|m| err(text, m.clone()))?;
            let mut notes = Vec::new();
            let Some(verdict) = self.eval_rule(rule, pkt, &mut notes).map_err(|m| err(text, m))? else { continue };
            notes.retain(|n| !n.is_empty());
            path.push(Step { chain: name.to_string(), rule: text.clone(), matched: notes });
            let Some(verdict) = verdict else { continue };
            let flow = self.follow(&verdict, pkt, path, depth).map_err(|e| if e.rule.is_empty() { err(text, e.message) } else { e })?;
            match flow {
                Next::Rule => continue,
                Next::Return => return Ok(Flow::Continue),
                Next::Final(v) => return Ok(Flow::Final(v)),
            }
        }
        Ok(Flow::Continue)
    }

    fn follow(&self, verdict: &str, pkt: &Packet, path: &mut Vec<Step>, depth: usize) -> Result<Next, TraceError> {
        let mut words = verdict.split(' ');
        match (words.next(), words.next()) {
            (Some("accept"), None) => Ok(Next::Final(Verdict::Accept)),
            // The packet goes no further (the sender gets a reset): a drop to the flow.
            (Some("drop" | "reject"), None) => Ok(Next::Final(Verdict::Drop)),
            (Some("return"), None) => Ok(Next::Return),
            (Some("jump"), Some(target)) => match self.run_chain(target, pkt, path, depth + 1)? {
                Flow::Continue => Ok(Next::Rule),
                Flow::Final(v) => Ok(Next::Final(v)),
            },
            // goto: the target's end returns to *our* caller.
            (Some("goto"), Some(target)) => match self.run_chain(target, pkt, path, depth + 1)? {
                Flow::Continue => Ok(Next::Return),
                Flow::Final(v) => Ok(Next::Final(v)),
            },
            _ => Err(TraceError { chain: String::new(), rule: String::new(), message: format!("unknown verdict {verdict:?}") }),
        }
    }

    fn set(&self, name: &str) -> Result<&CompiledSet, String> {
        self.sets.get(name).ok_or_else(|| format!("no set {name}"))
    }

    /// The note of the element of `set` matching every field of `vals`, or `None` when no
    /// element matches.
    fn set_match(&self, set: &str, vals: &[Val<'_>]) -> Result<Option<&str>, String> {
        for (keys, note, _) in &self.set(set)?.elements {
            let keys = keys.as_ref().map_err(Clone::clone)?;
            if keys.len() != vals.len() {
                return Err(format!("the elements of {set} do not have {} fields", vals.len()));
            }
            if keys.iter().zip(vals).all(|(k, v)| key_matches(k, v)) {
                return Ok(Some(note));
            }
        }
        Ok(None)
    }

    /// Evaluates one rule: `Ok(None)` if it does not match, else the verdict it gives (`None`:
    /// matched, go on). `notes` gets the comment of each set or map element the rule matched
    /// on (the pod and policy rule behind it).
    fn eval_rule(&self, rule: &Rule, pkt: &Packet, notes: &mut Vec<String>) -> Result<Option<Option<String>>, String> {
        let v6 = pkt.src.is_ipv6();
        let addr = |field: Field| if field == Field::Saddr { pkt.src } else { pkt.dst };
        let iface = |i: Iface| if i == Iface::In { pkt.iif.as_str() } else { pkt.oif.as_str() };
        let l4 = pkt.l4.nft_name(v6);
        for m in &rule.matches {
            let hit = match m {
                Match::CtState(states) => states.contains(&pkt.ct),
                Match::MarkBit | Match::IcmpType => false,
                Match::L4proto { neg, proto } => (proto == l4) != *neg,
                Match::Nfproto { neg, v6: want } => (*want == v6) != *neg,
                Match::IfName { iface: i, neg, pattern } => {
                    let name = iface(*i);
                    let hit = match pattern.strip_suffix('*') {
                        Some(prefix) => name.starts_with(prefix),
                        None => name == pattern,
                    };
                    hit != *neg
                }
                Match::IfSet { iface: i, set } => note(self.set_match(set, &[Val::Iface(iface(*i))])?, notes),
                Match::IfProtoPort { iface: i, set } => {
                    pkt.l4 != L4::Icmp && note(self.set_match(set, &[Val::Iface(iface(*i)), Val::Proto(l4), Val::Port(pkt.dport)])?, notes)
                }
                Match::IfAddr { iface: i, v6: fam, field, neg, set } => {
                    *fam == v6 && self.set_match(set, &[Val::Iface(iface(*i)), Val::Addr(addr(*field))])?.is_some() != *neg
                }
                Match::AddrSet { v6: fam, field, neg, set } => {
                    // The matched element's comment names the peer (a positive match only).
                    let hit = match self.set_match(set, &[Val::Addr(addr(*field))])? {
                        Some(comment) if !neg => {
                            notes.push(comment.to_string());
                            true
                        }
                        hit => hit.is_some(),
                    };
                    *fam == v6 && hit != *neg
                }
                Match::AddrLit { v6: fam, field, neg, range } => *fam == v6 && in_range(*range, addr(*field)) != *neg,
                Match::AddrProtoPort { v6: fam, field, neg, set } => {
                    if *fam != v6 || pkt.l4 == L4::Icmp {
                        false
                    } else {
                        let hit = self.set_match(set, &[Val::Addr(addr(*field)), Val::Proto(l4), Val::Port(pkt.dport)])?;
                        if *neg { hit.is_none() } else { note(hit, notes) }
                    }
                }
                Match::Ports { proto, neg, ranges } => {
                    let proto_ok = match proto {
                        None => pkt.l4 != L4::Icmp,
                        Some(p) => p == l4,
                    };
                    proto_ok && ranges.iter().any(|(s, e)| (*s..=*e).contains(&pkt.dport)) != *neg
                }
            };
            if !hit {
                return Ok(None);
            }
        }
        Ok(match &rule.action {
            Action::Continue => Some(None),
            Action::Verdict(v) => Some(Some(v.clone())),
            Action::IfVmap { iface: i, map } => {
                let m = self.sets.get(map).ok_or(format!("no map {map}"))?;
                m.by_iface.get(iface(*i)).map(|&e| {
                    let (_, note, verdict) = &m.elements[e];
                    notes.push(note.clone());
                    verdict.clone()
                })
            }
            Action::AddrVmap { v6: fam, field, map } => {
                if *fam != v6 {
                    return Ok(None);
                }
                let m = self.sets.get(map).ok_or(format!("no map {map}"))?;
                let mut found = None;
                for (keys, note, verdict) in &m.elements {
                    let keys = keys.as_ref().map_err(Clone::clone)?;
                    if let [Key::Addr(lo, hi)] = keys.as_slice()
                        && in_range((*lo, *hi), addr(*field))
                    {
                        notes.push(note.clone());
                        found = Some(verdict.clone());
                        break;
                    }
                }
                found
            }
        })
    }
}

enum Next {
    Rule,
    Return,
    Final(Verdict),
}

/// Parses one rule into its matches and action.
fn compile_rule(rule: &str) -> Result<Rule, String> {
    let toks: Vec<Tok> = parse::tokenize(rule).map_err(|e| e.message)?.into_iter().map(|(t, _)| t).collect();
    let mut c = Cursor { toks: &toks, pos: 0 };
    let mut matches = Vec::new();
    while let Some(t) = c.peek().cloned() {
        let Tok::Word(w) = t else { return Err(format!("unexpected token {t:?}")) };
        match w {
            "counter" => c.pos += 1,
            // The first packet of a flow is under any rate: `limit` matches it.
            "limit" => {
                c.pos += 1;
                c.keyword("rate")?;
                c.word()?;
                if c.peek_word() == Some("burst") {
                    c.pos += 1;
                    c.word()?;
                    c.keyword("packets")?;
                }
            }
            "log" => {
                c.pos += 1;
                if c.peek_word() == Some("prefix") {
                    c.pos += 1;
                    c.string()?;
                }
                if c.peek_word() == Some("group") {
                    c.pos += 1;
                    c.word()?;
                }
            }
            "comment" => {
                c.pos += 1;
                c.string()?;
            }
            "reject" => {
                c.pos += 1;
                for kw in ["with", "tcp", "reset"] {
                    c.keyword(kw)?;
                }
                c.end()?;
                return Ok(Rule { matches, action: Action::Verdict("reject".into()) });
            }
            "accept" | "drop" | "return" => {
                c.pos += 1;
                c.end()?;
                return Ok(Rule { matches, action: Action::Verdict(w.to_string()) });
            }
            "jump" | "goto" => {
                c.pos += 1;
                let target = c.word()?;
                c.end()?;
                return Ok(Rule { matches, action: Action::Verdict(format!("{w} {target}")) });
            }
            "ct" | "meta" if c.toks.get(c.pos + 1) == Some(&Tok::Word("mark")) && c.toks.get(c.pos + 2) == Some(&Tok::Word("set")) => {
                // ct mark set ct mark | BIT: a domain rule marks the connections it admits;
                // the verdict does not depend on it.
                c.pos += 3;
                for kw in [w, "mark", "|"] {
                    c.keyword(kw)?;
                }
                c.word()?;
            }
            "ct" | "meta" if c.toks.get(c.pos + 1) == Some(&Tok::Word("mark")) => {
                c.pos += 2;
                c.keyword("&")?;
                let bit = c.word()?;
                c.keyword("==")?;
                c.keyword(&bit)?;
                matches.push(Match::MarkBit);
            }
            "ct" => {
                c.pos += 1;
                c.keyword("state")?;
                let states = c.word()?;
                let states = states
                    .split(',')
                    .map(|s| match s {
                        "new" => Ok(Ct::New),
                        "established" => Ok(Ct::Established),
                        "related" => Ok(Ct::Related),
                        "invalid" => Ok(Ct::Invalid),
                        other => Err(format!("unknown ct state {other}")),
                    })
                    .collect::<Result<Vec<Ct>, String>>()?;
                matches.push(Match::CtState(states));
            }
            "meta" => {
                c.pos += 1;
                let key = c.word()?;
                let neg = c.neg();
                let want = c.word()?;
                matches.push(match key.as_str() {
                    "l4proto" => Match::L4proto { neg, proto: want },
                    "nfproto" => match want.as_str() {
                        "ipv4" => Match::Nfproto { neg, v6: false },
                        "ipv6" => Match::Nfproto { neg, v6: true },
                        other => return Err(format!("unknown nfproto {other}")),
                    },
                    other => return Err(format!("unknown meta key {other}")),
                });
            }
            "icmp" | "icmpv6" => {
                c.pos += 1;
                c.keyword("type")?;
                if c.peek() == Some(&Tok::LBrace) {
                    c.pos += 1;
                    while c.peek() != Some(&Tok::RBrace) {
                        match c.toks.get(c.pos) {
                            Some(Tok::Word(_) | Tok::Comma) => c.pos += 1,
                            other => return Err(format!("bad icmp type list at {other:?}")),
                        }
                    }
                    c.pos += 1;
                } else {
                    c.word()?;
                }
                matches.push(Match::IcmpType);
            }
            "iifname" | "oifname" => {
                c.pos += 1;
                let iface = if w == "iifname" { Iface::In } else { Iface::Out };
                if c.peek_word() == Some("vmap") {
                    c.pos += 1;
                    let map = c.set_ref()?;
                    c.end()?;
                    return Ok(Rule { matches, action: Action::IfVmap { iface, map } });
                }
                if let Some(set) = c.peek_word().and_then(|w| w.strip_prefix('@')).map(str::to_string) {
                    // oifname @set
                    c.pos += 1;
                    matches.push(Match::IfSet { iface, set });
                    continue;
                }
                if c.peek_word() == Some(".") && c.toks.get(c.pos + 1) == Some(&Tok::Word("meta")) {
                    // oifname . meta l4proto . th dport @set
                    for kw in [".", "meta", "l4proto", ".", "th", "dport"] {
                        c.keyword(kw)?;
                    }
                    let set = c.set_ref()?;
                    matches.push(Match::IfProtoPort { iface, set });
                    continue;
                }
                if c.peek_word() == Some(".") {
                    // iifname . ip saddr [!=] @set
                    c.pos += 1;
                    let (v6, field) = c.addr_field()?;
                    let neg = c.neg();
                    let set = c.set_ref()?;
                    matches.push(Match::IfAddr { iface, v6, field, neg, set });
                    continue;
                }
                let neg = c.neg();
                let pattern = c.string()?;
                matches.push(Match::IfName { iface, neg, pattern });
            }
            "ip6" if c.toks.get(c.pos + 1) == Some(&Tok::Word("hoplimit")) => {
                // Only in rules of ICMPv6 types, which no traced flow matches.
                c.pos += 2;
                c.word()?;
                matches.push(Match::IcmpType);
            }
            "ip" | "ip6" => {
                let (v6, field) = c.addr_field()?;
                if c.peek_word() == Some("vmap") {
                    // ip saddr vmap @map: the element containing the address gives the verdict
                    c.pos += 1;
                    let map = c.set_ref()?;
                    c.end()?;
                    return Ok(Rule { matches, action: Action::AddrVmap { v6, field, map } });
                }
                if c.peek_word() == Some(".") {
                    // ip daddr . meta l4proto . th dport @set
                    for kw in [".", "meta", "l4proto", ".", "th", "dport"] {
                        c.keyword(kw)?;
                    }
                    let neg = c.neg();
                    let set = c.set_ref()?;
                    matches.push(Match::AddrProtoPort { v6, field, neg, set });
                    continue;
                }
                let neg = c.neg();
                if let Some(set) = c.peek_word().and_then(|w| w.strip_prefix('@')).map(str::to_string) {
                    c.pos += 1;
                    matches.push(Match::AddrSet { v6, field, neg, set });
                } else {
                    let lit = c.word()?;
                    let range = addr_range(&lit).ok_or(format!("bad address {lit}"))?;
                    matches.push(Match::AddrLit { v6, field, neg, range });
                }
            }
            "tcp" | "udp" | "sctp" | "th" => {
                c.pos += 1;
                c.keyword("dport")?;
                let neg = c.neg();
                let ranges = c.port_list()?;
                matches.push(Match::Ports { proto: (w != "th").then(|| w.to_string()), neg, ranges });
            }
            other => return Err(format!("unknown rule shape at {other:?}")),
        }
    }
    Ok(Rule { matches, action: Action::Continue })
}

struct Cursor<'a> {
    toks: &'a [Tok<'a>],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&Tok<'a>> {
        self.toks.get(self.pos)
    }

    fn peek_word(&self) -> Option<&str> {
        match self.peek() {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    fn word(&mut self) -> Result<String, String> {
        match self.toks.get(self.pos) {
            Some(Tok::Word(w)) => {
                self.pos += 1;
                Ok(w.to_string())
            }
            other => Err(format!("expected a word, found {other:?}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        match self.toks.get(self.pos) {
            Some(Tok::Str(s)) => {
                self.pos += 1;
                Ok(s.to_string())
            }
            other => Err(format!("expected a string, found {other:?}")),
        }
    }

    fn keyword(&mut self, kw: &str) -> Result<(), String> {
        let w = self.word()?;
        if w == kw { Ok(()) } else { Err(format!("expected {kw}, found {w}")) }
    }

    fn neg(&mut self) -> bool {
        if self.peek_word() == Some("!=") {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn set_ref(&mut self) -> Result<String, String> {
        let w = self.word()?;
        w.strip_prefix('@').map(str::to_string).ok_or(format!("expected @set, found {w}"))
    }

    /// `ip saddr` / `ip6 daddr` → (is v6, field).
    fn addr_field(&mut self) -> Result<(bool, Field), String> {
        let fam = self.word()?;
        let v6 = match fam.as_str() {
            "ip" => false,
            "ip6" => true,
            other => return Err(format!("expected ip or ip6, found {other}")),
        };
        let field = match self.word()?.as_str() {
            "saddr" => Field::Saddr,
            "daddr" => Field::Daddr,
            other => return Err(format!("unknown address field {other}")),
        };
        Ok((v6, field))
    }

    /// `80`, `80-90`, or `{ 80, 81-90 }`.
    fn port_list(&mut self) -> Result<Vec<(u16, u16)>, String> {
        let one = |w: &str| -> Result<(u16, u16), String> {
            let (a, b) = w.split_once('-').unwrap_or((w, w));
            Ok((a.parse().map_err(|_| format!("bad port {w}"))?, b.parse().map_err(|_| format!("bad port {w}"))?))
        };
        if self.peek() == Some(&Tok::LBrace) {
            self.pos += 1;
            let mut out = Vec::new();
            loop {
                match self.toks.get(self.pos) {
                    Some(Tok::RBrace) => {
                        self.pos += 1;
                        return Ok(out);
                    }
                    Some(Tok::Comma) => self.pos += 1,
                    Some(Tok::Word(w)) => {
                        out.push(one(w)?);
                        self.pos += 1;
                    }
                    other => return Err(format!("bad port list at {other:?}")),
                }
            }
        }
        Ok(vec![one(&self.word()?)?])
    }

    fn end(&self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(Tok::Word("comment")) => Ok(()),
            Some(t) => Err(format!("unexpected {t:?} after the verdict")),
        }
    }
}

enum Val<'a> {
    Iface(&'a str),
    Addr(IpAddr),
    Proto(&'a str),
    Port(u16),
}

fn key_matches(k: &Key, v: &Val<'_>) -> bool {
    match (k, v) {
        (Key::Iface(k), Val::Iface(v)) => k == v,
        (Key::Addr(lo, hi), Val::Addr(a)) => in_range((*lo, *hi), *a),
        (Key::Proto(k), Val::Proto(v)) => k == v,
        (Key::Ports(lo, hi), Val::Port(p)) => (*lo..=*hi).contains(p),
        _ => false,
    }
}

/// One field of a set element's key, read as the set's type for that field says:
/// `"flk1"`, an address, prefix or range, a protocol name, a port or port range.
fn parse_key(ty: &str, part: &str) -> Option<Key> {
    match ty {
        "ifname" => Some(Key::Iface(part.strip_prefix('"')?.strip_suffix('"')?.to_string())),
        "ipv4_addr" | "ipv6_addr" => {
            let (lo, hi) = addr_range(part)?;
            (lo.is_ipv6() == (ty == "ipv6_addr")).then_some(Key::Addr(lo, hi))
        }
        "inet_proto" => Some(Key::Proto(part.to_string())),
        "inet_service" => {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            Some(Key::Ports(a.parse().ok()?, b.parse().ok()?))
        }
        _ => None,
    }
}

/// Records the matched element's comment; whether an element matched.
fn note(hit: Option<&str>, notes: &mut Vec<String>) -> bool {
    match hit {
        Some(comment) => {
            notes.push(comment.to_string());
            true
        }
        None => false,
    }
}

/// Whether `addr` is within the inclusive range (an address of the other family never is).
fn in_range((lo, hi): (IpAddr, IpAddr), addr: IpAddr) -> bool {
    match (lo, hi, addr) {
        (IpAddr::V4(a), IpAddr::V4(b), IpAddr::V4(x)) => a <= x && x <= b,
        (IpAddr::V6(a), IpAddr::V6(b), IpAddr::V6(x)) => a <= x && x <= b,
        _ => false,
    }
}

/// `lit` (an address, a prefix or a range `a-b`) as an inclusive range; `None` if it is none
/// of those.
fn addr_range(lit: &str) -> Option<(IpAddr, IpAddr)> {
    if let Ok(a) = lit.parse::<IpAddr>() {
        return Some((a, a));
    }
    if let Ok(n) = lit.parse::<IpNet>() {
        return Some((n.network(), n.broadcast()));
    }
    let (a, b) = lit.split_once('-')?;
    let (a, b): (IpAddr, IpAddr) = (a.parse().ok()?, b.parse().ok()?);
    (a.is_ipv4() == b.is_ipv4()).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::table::Ruleset;

    const RS: &str = r#"table inet t {
	set peers {
		type ipv4_addr
		flags interval
		elements = { 198.18.1.0/24 comment "x", 198.18.3.1-198.18.3.5 }
	}
	set np {
		type ipv4_addr . inet_proto . inet_service
		elements = { 198.18.1.1 . tcp . 8080 }
	}
	set addrs {
		type ifname . ipv4_addr
		elements = { "flk1" . 198.18.1.1, "flk2" . 198.18.2.2 }
	}
	chain in1 {
		ip saddr @peers tcp dport { 80, 90-99 } accept comment "p ingress[0]"
		counter drop
	}
	chain out2 {
		ip daddr . meta l4proto . th dport @np return
		counter drop
	}
	map ing {
		type ifname : verdict
		elements = { "flk1" : goto in1, "flk2" : accept }
	}
	map eg {
		type ifname : verdict
		elements = { "flk2" : jump out2 }
	}
	chain from {
		iifname . ip saddr != @addrs counter drop
		iifname vmap @eg
	}
	chain to {
		oifname vmap @ing
		counter drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
		iifname "flk*" jump from
		oifname "flk*" jump to
	}
}
"#;

    fn pkt(iif: &str, oif: &str, src: &str, dst: &str, l4: L4, dport: u16) -> Packet {
        Packet { iif: iif.into(), oif: oif.into(), src: src.parse().unwrap(), dst: dst.parse().unwrap(), l4, dport, ct: Ct::New }
    }

    fn verdict(p: &Packet) -> Verdict {
        let r = Ruleset::from_text(RS).unwrap();
        trace(r.table("inet", "t").unwrap(), "forward", p).unwrap().verdict
    }

    #[test]
    fn follows_maps_jumps_gotos_and_returns() {
        // flk2 → flk1: egress of flk2 returns only for 198.18.2.2 . tcp . 8080 → dropped here.
        assert_eq!(verdict(&pkt("flk2", "flk1", "198.18.2.2", "198.18.1.1", L4::Tcp, 80)), Verdict::Drop);
        // An uplink source in the peer range to flk1:80 → accepted by in1.
        assert_eq!(verdict(&pkt("eth0", "flk1", "198.18.1.7", "198.18.1.1", L4::Tcp, 80)), Verdict::Accept);
        assert_eq!(verdict(&pkt("eth0", "flk1", "198.18.3.3", "198.18.1.1", L4::Tcp, 95)), Verdict::Accept);
        assert_eq!(verdict(&pkt("eth0", "flk1", "198.18.3.6", "198.18.1.1", L4::Tcp, 95)), Verdict::Drop);
        assert_eq!(verdict(&pkt("eth0", "flk1", "198.18.1.7", "198.18.1.1", L4::Udp, 80)), Verdict::Drop);
        // Spoofed source from flk1.
        assert_eq!(verdict(&pkt("flk1", "eth0", "198.18.1.9", "198.18.9.9", L4::Tcp, 80)), Verdict::Drop);
        // flk1 (not egress-isolated) to the outside: accepted by policy.
        assert_eq!(verdict(&pkt("flk1", "eth0", "198.18.1.1", "198.18.9.9", L4::Icmp, 0)), Verdict::Accept);
        // Unknown pod interface.
        assert_eq!(verdict(&pkt("eth0", "flk9", "198.18.1.1", "198.18.9.9", L4::Tcp, 80)), Verdict::Drop);
        // Established traffic short-circuits.
        let mut p = pkt("eth0", "flk9", "198.18.1.1", "198.18.9.9", L4::Tcp, 80);
        p.ct = Ct::Established;
        assert_eq!(verdict(&p), Verdict::Accept);
    }

    #[test]
    fn egress_return_continues_to_ingress() {
        // flk2 → flk1 on 8080 is allowed by flk2's egress, then flk1's ingress drops it.
        let r = Ruleset::from_text(RS).unwrap();
        let t = trace(r.table("inet", "t").unwrap(), "forward", &pkt("flk2", "flk1", "198.18.2.2", "198.18.1.1", L4::Tcp, 8080)).unwrap();
        assert_eq!(t.verdict, Verdict::Drop);
        assert!(t.path.iter().any(|p| p.chain == "out2" && p.rule.starts_with("ip daddr")), "{t}");
        let last = t.path.last().unwrap();
        assert!(last.chain == "in1" && last.rule.starts_with("counter drop"), "{t}");
    }

    #[test]
    fn ipv4_rules_do_not_match_ipv6_packets() {
        // No v6 address of flk1 in @addrs, but `ip saddr` only applies to IPv4: the v6 packet
        // passes the v4 check (and the ruleset under test has no v6 check).
        assert_eq!(verdict(&pkt("flk1", "eth0", "2001:db8::1", "2001:db8::2", L4::Tcp, 80)), Verdict::Accept);
    }

    #[test]
    fn unknown_shapes_are_errors() {
        let r = Ruleset::from_text(
            "table inet t {\n\tchain c {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tip dscp 4 accept\n\t}\n}\n",
        )
        .unwrap();
        let e = trace(r.table("inet", "t").unwrap(), "c", &pkt("a", "b", "198.18.0.1", "198.18.0.2", L4::Tcp, 1)).unwrap_err();
        assert!(e.message.contains("unknown"), "{e}");
    }
}
