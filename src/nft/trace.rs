//! A packet tracer over an in-memory table, like kube-proxy's `nftablesTracer`: runs one
//! packet through a base chain and reports the verdict and the rules it matched.
//!
//! It understands exactly the rule shapes flock writes; any other shape is an error (a test
//! failure), never a guess. This is how tests check policy *outcomes* over the very text
//! that is sent to nft.

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

impl Ct {
    fn name(self) -> &'static str {
        match self {
            Ct::New => "new",
            Ct::Established => "established",
            Ct::Related => "related",
            Ct::Invalid => "invalid",
        }
    }
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
    pub matched: Vec<String>,
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
    pub chain: String,
    pub rule: String,
    pub message: String,
}

enum Flow {
    /// The chain ended, or `return`.
    Continue,
    Final(Verdict),
}

/// Runs `pkt` through base chain `base` of `table`.
pub fn trace(table: &Table, base: &str, pkt: &Packet) -> Result<Trace, TraceError> {
    let mut path = Vec::new();
    let chain =
        table.chains.get(base).ok_or_else(|| TraceError { chain: base.into(), rule: String::new(), message: "no such chain".into() })?;
    let policy_drop = chain.spec.hook.as_deref().is_some_and(|h| h.contains("policy drop"));
    let flow = run_chain(table, base, pkt, &mut path, 0)?;
    let verdict = match flow {
        Flow::Final(v) => v,
        Flow::Continue if policy_drop => Verdict::Drop,
        Flow::Continue => Verdict::Accept,
    };
    Ok(Trace { verdict, path })
}

fn run_chain(table: &Table, name: &str, pkt: &Packet, path: &mut Vec<Step>, depth: usize) -> Result<Flow, TraceError> {
    let err = |rule: &str, message: String| TraceError { chain: name.into(), rule: rule.into(), message };
    if depth > 16 {
        return Err(err("", "jump depth exceeded (a loop?)".into()));
    }
    let chain = table.chains.get(name).ok_or_else(|| err("", "no such chain".into()))?;
    for rule in &chain.rules {
        let mut notes = Vec::new();
        let Some(action) = eval_rule(table, rule, pkt, &mut notes).map_err(|m| err(rule, m))? else { continue };
        notes.retain(|n| !n.is_empty());
        path.push(Step { chain: name.to_string(), rule: rule.clone(), matched: notes });
        let flow = match action {
            Action::Continue => continue,
            Action::Verdict(v) => {
                follow(table, &v, pkt, path, depth).map_err(|e| if e.rule.is_empty() { err(rule, e.message) } else { e })?
            }
        };
        match flow {
            Next::Rule => continue,
            Next::Return => return Ok(Flow::Continue),
            Next::Final(v) => return Ok(Flow::Final(v)),
        }
    }
    Ok(Flow::Continue)
}

enum Next {
    Rule,
    Return,
    Final(Verdict),
}

fn follow(table: &Table, verdict: &str, pkt: &Packet, path: &mut Vec<Step>, depth: usize) -> Result<Next, TraceError> {
    let mut words = verdict.split(' ');
    match (words.next(), words.next()) {
        (Some("accept"), None) => Ok(Next::Final(Verdict::Accept)),
        // The packet goes no further (the sender gets a reset): a drop to the flow.
        (Some("drop" | "reject"), None) => Ok(Next::Final(Verdict::Drop)),
        (Some("return"), None) => Ok(Next::Return),
        (Some("jump"), Some(target)) => match run_chain(table, target, pkt, path, depth + 1)? {
            Flow::Continue => Ok(Next::Rule),
            Flow::Final(v) => Ok(Next::Final(v)),
        },
        // goto: the target's end returns to *our* caller.
        (Some("goto"), Some(target)) => match run_chain(table, target, pkt, path, depth + 1)? {
            Flow::Continue => Ok(Next::Return),
            Flow::Final(v) => Ok(Next::Final(v)),
        },
        _ => Err(TraceError { chain: String::new(), rule: String::new(), message: format!("unknown verdict {verdict:?}") }),
    }
}

enum Action {
    /// Matched, no verdict (e.g. a lone `counter`).
    Continue,
    Verdict(String),
}

/// Evaluates one rule: `Ok(None)` if it does not match.
/// `notes` gets the comment of each set or map element the rule matched on (the pod and
/// policy rule behind it).
fn eval_rule(table: &Table, rule: &str, pkt: &Packet, notes: &mut Vec<String>) -> Result<Option<Action>, String> {
    let toks: Vec<Tok> = parse::tokenize(rule).map_err(|e| e.message)?.into_iter().map(|(t, _)| t).collect();
    let mut c = Cursor { toks: &toks, pos: 0 };
    let v6 = pkt.src.is_ipv6();
    let mut matched = true;
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
                return Ok(matched.then(|| Action::Verdict("reject".into())));
            }
            "accept" | "drop" | "return" => {
                c.pos += 1;
                c.end()?;
                return Ok(matched.then(|| Action::Verdict(w.to_string())));
            }
            "jump" | "goto" => {
                c.pos += 1;
                let target = c.word()?;
                c.end()?;
                return Ok(matched.then(|| Action::Verdict(format!("{w} {target}"))));
            }
            "ct" if c.toks.get(c.pos + 1) == Some(&Tok::Word("mark")) && c.toks.get(c.pos + 2) == Some(&Tok::Word("set")) => {
                // ct mark set ct mark | BIT: a domain rule marks the connections it admits;
                // the verdict does not depend on it.
                c.pos += 3;
                for kw in ["ct", "mark", "|"] {
                    c.keyword(kw)?;
                }
                c.word()?;
            }
            "ct" if c.toks.get(c.pos + 1) == Some(&Tok::Word("mark")) => {
                // ct mark & BIT == BIT: a mark flock sets on connections it revoked. The
                // traced packet opens a connection, whose mark is 0.
                c.pos += 2;
                c.keyword("&")?;
                let bit = c.word()?;
                c.keyword("==")?;
                c.keyword(&bit)?;
                matched = false;
            }
            "ct" => {
                c.pos += 1;
                c.keyword("state")?;
                let states = c.word()?;
                matched &= states.split(',').any(|s| s == pkt.ct.name());
            }
            "meta" => {
                c.pos += 1;
                let key = c.word()?;
                let neg = c.neg();
                let want = c.word()?;
                let hit = match key.as_str() {
                    "l4proto" => want == pkt.l4.nft_name(v6),
                    "nfproto" => want == if v6 { "ipv6" } else { "ipv4" },
                    other => return Err(format!("unknown meta key {other}")),
                };
                matched &= hit != neg;
            }
            "iifname" | "oifname" => {
                c.pos += 1;
                let iface = if w == "iifname" { &pkt.iif } else { &pkt.oif };
                if c.peek_word() == Some("vmap") {
                    c.pos += 1;
                    let map = c.set_ref()?;
                    c.end()?;
                    if !matched {
                        return Ok(None);
                    }
                    let key = format!("\"{iface}\"");
                    let m = table.sets.get(&map).ok_or(format!("no map {map}"))?;
                    let Some(e) = m.elements.get(&key) else { return Ok(None) };
                    notes.push(e.comment.clone().unwrap_or_default());
                    return Ok(e.verdict.clone().map(Action::Verdict));
                }
                if let Some(set) = c.peek_word().and_then(|w| w.strip_prefix('@')).map(str::to_string) {
                    // oifname @set
                    c.pos += 1;
                    let hit = set_match(table, &set, &[Val::Iface(iface)])?;
                    matched &= note(hit, notes);
                    continue;
                }
                if c.peek_word() == Some(".") && c.toks.get(c.pos + 1) == Some(&Tok::Word("meta")) {
                    // oifname . meta l4proto . th dport @set
                    for kw in [".", "meta", "l4proto", ".", "th", "dport"] {
                        c.keyword(kw)?;
                    }
                    let set = c.set_ref()?;
                    if pkt.l4 == L4::Icmp {
                        matched = false;
                        continue;
                    }
                    let hit = set_match(table, &set, &[Val::Iface(iface), Val::Proto(pkt.l4.nft_name(v6)), Val::Port(pkt.dport)])?;
                    matched &= note(hit, notes);
                    continue;
                }
                if c.peek_word() == Some(".") {
                    // iifname . ip saddr [!=] @set
                    c.pos += 1;
                    let (fam_v6, field) = c.addr_field()?;
                    let neg = c.neg();
                    let set = c.set_ref()?;
                    if fam_v6 != v6 {
                        matched = false;
                        continue;
                    }
                    let addr = if field == "saddr" { pkt.src } else { pkt.dst };
                    let hit = set_contains(table, &set, &[Val::Iface(iface), Val::Addr(addr)])?;
                    matched &= hit != neg;
                    continue;
                }
                let neg = c.neg();
                let pat = c.string()?;
                let hit = match pat.strip_suffix('*') {
                    Some(prefix) => iface.starts_with(prefix),
                    None => *iface == pat,
                };
                matched &= hit != neg;
            }
            "ip" | "ip6" => {
                let (fam_v6, field) = c.addr_field()?;
                let addr = if field == "saddr" { pkt.src } else { pkt.dst };
                if c.peek_word() == Some("vmap") {
                    // ip saddr vmap @map: the element containing the address gives the verdict
                    c.pos += 1;
                    let map = c.set_ref()?;
                    c.end()?;
                    if !matched || fam_v6 != v6 {
                        return Ok(None);
                    }
                    let m = table.sets.get(&map).ok_or(format!("no map {map}"))?;
                    for (key, e) in &m.elements {
                        if addr_matches(key, addr).ok_or(format!("bad address {key} in {map}"))? {
                            notes.push(e.comment.clone().unwrap_or_default());
                            return Ok(e.verdict.clone().map(Action::Verdict));
                        }
                    }
                    return Ok(None);
                }
                if c.peek_word() == Some(".") {
                    // ip daddr . meta l4proto . th dport @set
                    for kw in [".", "meta", "l4proto", ".", "th", "dport"] {
                        c.keyword(kw)?;
                    }
                    let neg = c.neg();
                    let set = c.set_ref()?;
                    if fam_v6 != v6 || pkt.l4 == L4::Icmp {
                        matched = false;
                        continue;
                    }
                    let hit = set_match(table, &set, &[Val::Addr(addr), Val::Proto(pkt.l4.nft_name(v6)), Val::Port(pkt.dport)])?;
                    matched &= if neg { hit.is_none() } else { note(hit, notes) };
                    continue;
                }
                let neg = c.neg();
                let hit = if let Some(set) = c.peek_word().and_then(|w| w.strip_prefix('@')).map(str::to_string) {
                    c.pos += 1;
                    // The matched element's comment names the peer (a positive match only).
                    match set_match(table, &set, &[Val::Addr(addr)])? {
                        Some(comment) if !neg => {
                            notes.push(comment);
                            true
                        }
                        hit => hit.is_some(),
                    }
                } else {
                    let lit = c.word()?;
                    addr_matches(&lit, addr).ok_or(format!("bad address {lit}"))?
                };
                if fam_v6 != v6 {
                    matched = false;
                    continue;
                }
                matched &= hit != neg;
            }
            "tcp" | "udp" | "sctp" | "th" => {
                let proto = w;
                c.pos += 1;
                c.keyword("dport")?;
                let neg = c.neg();
                let ports = c.port_list()?;
                let proto_ok = if proto == "th" { pkt.l4 != L4::Icmp } else { pkt.l4.nft_name(v6) == proto };
                let hit = proto_ok && ports.iter().any(|(s, e)| (*s..=*e).contains(&pkt.dport));
                matched &= proto_ok && (hit != neg);
            }
            other => return Err(format!("unknown rule shape at {other:?}")),
        }
    }
    Ok(matched.then_some(Action::Continue))
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
    fn addr_field(&mut self) -> Result<(bool, String), String> {
        let fam = self.word()?;
        let v6 = match fam.as_str() {
            "ip" => false,
            "ip6" => true,
            other => return Err(format!("expected ip or ip6, found {other}")),
        };
        let field = self.word()?;
        if field != "saddr" && field != "daddr" {
            return Err(format!("unknown address field {field}"));
        }
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

/// Whether `set` holds an element matching every field of `vals`.
fn set_contains(table: &Table, set: &str, vals: &[Val<'_>]) -> Result<bool, String> {
    Ok(set_match(table, set, vals)?.is_some())
}

/// Records the matched element's comment; whether an element matched.
fn note(hit: Option<String>, notes: &mut Vec<String>) -> bool {
    match hit {
        Some(comment) => {
            notes.push(comment);
            true
        }
        None => false,
    }
}

/// The comment of the element of `set` matching every field of `vals` (empty if it has
/// none), or `None` when no element matches.
fn set_match(table: &Table, set: &str, vals: &[Val<'_>]) -> Result<Option<String>, String> {
    let s = table.sets.get(set).ok_or(format!("no set {set}"))?;
    for (key, elem) in &s.elements {
        let parts: Vec<&str> = key.split(" . ").collect();
        if parts.len() != vals.len() {
            return Err(format!("element {key} of {set} does not have {} fields", vals.len()));
        }
        let mut all = true;
        for (p, v) in parts.iter().zip(vals) {
            let hit = match v {
                Val::Iface(i) => p.trim_matches('"') == *i,
                Val::Addr(a) => addr_matches(p, *a).ok_or(format!("bad address {p} in {set}"))?,
                Val::Proto(pr) => p == pr,
                Val::Port(n) => {
                    let (a, b) = p.split_once('-').unwrap_or((p, p));
                    let (a, b): (u16, u16) =
                        (a.parse().map_err(|_| format!("bad port {p}"))?, b.parse().map_err(|_| format!("bad port {p}"))?);
                    (a..=b).contains(n)
                }
            };
            if !hit {
                all = false;
                break;
            }
        }
        if all {
            return Ok(Some(elem.note()));
        }
    }
    Ok(None)
}

/// Whether `lit` (an address, a prefix or a range `a-b`) contains `addr`; `None` if `lit` is
/// not one of those.
fn addr_matches(lit: &str, addr: IpAddr) -> Option<bool> {
    if let Ok(a) = lit.parse::<IpAddr>() {
        return Some(a == addr);
    }
    if let Ok(n) = lit.parse::<IpNet>() {
        return Some(n.contains(&addr));
    }
    let (a, b) = lit.split_once('-')?;
    let (a, b): (IpAddr, IpAddr) = (a.parse().ok()?, b.parse().ok()?);
    Some(match (a, b, addr) {
        (IpAddr::V4(a), IpAddr::V4(b), IpAddr::V4(x)) => a <= x && x <= b,
        (IpAddr::V6(a), IpAddr::V6(b), IpAddr::V6(x)) => a <= x && x <= b,
        _ => false,
    })
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
