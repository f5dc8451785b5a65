//! An in-memory nftables table: applies parsed commands with the kernel's rules for the
//! operations flock uses, and dumps a canonical listing.
//!
//! Checks mirror what the kernel refuses (verified on this machine's kernel and nft 1.0.6):
//! flushing or deleting a missing object; re-adding an object with other attributes; a rule
//! or map element that jumps to a missing chain or looks up a missing set; deleting a chain
//! or set something still refers to. Comments of existing objects are kept, as the kernel
//! keeps them. The canonical dump (objects by kind then name, elements sorted, rules in
//! order) is what tests compare, and what `nft list` output becomes when parsed back.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::parse::{self, ChainSpec, Command, Elem, Kind, ParseError, SetSpec};

/// Why a command or transaction was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("cannot parse the script: {0}")]
    Parse(#[from] ParseError),
    #[error("{what}: no such file or directory")]
    NotFound { what: String },
    #[error("{what}: file exists with other attributes")]
    Exists { what: String },
    #[error("{what}: device or resource busy (still referenced by {by})")]
    Busy { what: String, by: String },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
}

/// A chain's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainState {
    /// Assigned at creation, like the kernel's handle.
    pub(crate) handle: u64,
    pub(crate) spec: ChainSpec,
    pub(crate) rules: Vec<String>,
}

/// An element's data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ElemState {
    pub(crate) comment: Option<String>,
    pub(crate) verdict: Option<String>,
    /// A timed element's `timeout`/`expires`, as listed (`nft list` of a live table).
    pub(crate) timeout: Option<String>,
    pub(crate) expires: Option<String>,
}

impl ElemState {
    /// Its comment, and for a timed element how long it lives, when it was learned and what
    /// is left of it, for explanations:
    /// `api.example.test (learned 18s ago: timeout 30s, expires in 12s)`.
    pub(crate) fn note(&self) -> String {
        let comment = self.comment.clone().unwrap_or_default();
        match (&self.timeout, &self.expires) {
            (Some(t), Some(e)) => match (duration_ms(t), duration_ms(e)) {
                (Some(tm), Some(em)) if em <= tm => {
                    format!("{comment} (learned {} ago: timeout {t}, expires in {e})", duration_text(tm - em))
                }
                _ => format!("{comment} (learned: timeout {t}, expires in {e})"),
            },
            (Some(t), None) => format!("{comment} (learned: timeout {t})"),
            _ => comment,
        }
    }
}

/// Milliseconds as nft lists a duration: `1h2m5s`, `12s500ms`, `0s`.
pub(crate) fn duration_text(ms: u64) -> String {
    let (mut s, ms) = (ms / 1000, ms % 1000);
    let mut out = String::new();
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if s >= len {
            let _ = write!(out, "{}{unit}", s / len);
            s %= len;
        }
    }
    if s > 0 || (out.is_empty() && ms == 0) {
        let _ = write!(out, "{s}s");
    }
    if ms > 0 {
        let _ = write!(out, "{ms}ms");
    }
    out
}

/// The milliseconds of a duration as nft lists one ([`duration_text`]); `None` if it is not one.
pub(crate) fn duration_ms(text: &str) -> Option<u64> {
    let (mut total, mut rest) = (0u64, text);
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) =
            [("ms", 1), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)].into_iter().find(|(u, _)| rest.starts_with(u))?;
        total = total.checked_add(n.checked_mul(len)?)?;
        rest = &rest[unit.len()..];
    }
    Some(total)
}

/// A set's or map's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetState {
    pub(crate) handle: u64,
    pub(crate) kind: Kind,
    pub(crate) spec: SetSpec,
    pub(crate) elements: BTreeMap<String, ElemState>,
}

/// One table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub(crate) family: String,
    pub(crate) name: String,
    pub(crate) comment: Option<String>,
    pub chains: BTreeMap<String, ChainState>,
    pub(crate) sets: BTreeMap<String, SetState>,
}

/// A set of tables keyed by (family, name): what a network namespace holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    pub(crate) tables: BTreeMap<(String, String), Table>,
    next_handle: u64,
}

impl Ruleset {
    /// Applies a whole script atomically: on any error nothing changes.
    pub(crate) fn apply_script(&mut self, script: &str) -> Result<(), TableError> {
        let cmds = parse::parse(script)?;
        let mut next = self.clone();
        for c in &cmds {
            next.apply(c)?;
        }
        *self = next;
        Ok(())
    }

    /// Parses a listing (or any script) into a fresh ruleset.
    pub fn from_text(text: &str) -> Result<Self, TableError> {
        let mut r = Self::default();
        r.apply_script(text)?;
        Ok(r)
    }

    pub fn table(&self, family: &str, name: &str) -> Option<&Table> {
        self.tables.get(&(family.to_string(), name.to_string()))
    }

    fn table_mut(&mut self, family: &str, name: &str) -> Result<&mut Table, TableError> {
        self.tables
            .get_mut(&(family.to_string(), name.to_string()))
            .ok_or_else(|| TableError::NotFound { what: format!("table {family} {name}") })
    }

    /// Applies one command.
    pub(crate) fn apply(&mut self, cmd: &Command) -> Result<(), TableError> {
        check_comments(cmd)?;
        match cmd {
            Command::AddTable { family, table, comment } => {
                self.tables.entry((family.clone(), table.clone())).or_insert_with(|| Table {
                    family: family.clone(),
                    name: table.clone(),
                    comment: comment.clone(),
                    chains: BTreeMap::new(),
                    sets: BTreeMap::new(),
                });
                Ok(())
            }
            Command::DeleteTable { family, table } => self
                .tables
                .remove(&(family.clone(), table.clone()))
                .map(|_| ())
                .ok_or_else(|| TableError::NotFound { what: format!("table {family} {table}") }),
            Command::FlushTable { family, table } => {
                let t = self.table_mut(family, table)?;
                for c in t.chains.values_mut() {
                    c.rules.clear();
                }
                for s in t.sets.values_mut() {
                    s.elements.clear();
                }
                Ok(())
            }
            Command::AddChain { family, table, name, spec, create } => {
                self.next_handle += 1;
                let handle = self.next_handle;
                let t = self.table_mut(family, table)?;
                let what = format!("chain {family} {table} {name}");
                match t.chains.get(name) {
                    Some(_) if *create => Err(TableError::Exists { what }),
                    Some(existing) => {
                        if spec.hook.is_some() && spec.hook != existing.spec.hook {
                            return Err(TableError::Invalid {
                                what,
                                message: "operation not supported: the hook of an existing chain cannot change".into(),
                            });
                        }
                        Ok(())
                    }
                    None => {
                        t.chains.insert(name.clone(), ChainState { handle, spec: spec.clone(), rules: Vec::new() });
                        Ok(())
                    }
                }
            }
            Command::AddSet { family, table, kind, name, spec, create } => {
                self.next_handle += 1;
                let handle = self.next_handle;
                let t = self.table_mut(family, table)?;
                let what = format!("{kind} {family} {table} {name}");
                let is_map = spec.type_.contains(" : ");
                if (*kind == Kind::Map) != is_map {
                    return Err(TableError::Invalid { what, message: "a map needs `type key : data`, a set must not have data".into() });
                }
                match t.sets.get(name) {
                    Some(_) if *create => Err(TableError::Exists { what }),
                    Some(existing) => {
                        if existing.spec.type_ != spec.type_
                            || existing.spec.flags != spec.flags
                            || existing.spec.limit != spec.limit
                            || existing.kind != *kind
                        {
                            return Err(TableError::Exists { what });
                        }
                        Ok(())
                    }
                    None => {
                        t.sets.insert(name.clone(), SetState { handle, kind: *kind, spec: spec.clone(), elements: BTreeMap::new() });
                        Ok(())
                    }
                }
            }
            Command::Flush { family, table, kind, name } => {
                let t = self.table_mut(family, table)?;
                let what = format!("{kind} {family} {table} {name}");
                match kind {
                    Kind::Chain => t.chains.get_mut(name).map(|c| c.rules.clear()),
                    Kind::Set | Kind::Map => t.sets.get_mut(name).filter(|s| s.kind == *kind).map(|s| s.elements.clear()),
                }
                .ok_or(TableError::NotFound { what })
            }
            Command::Delete { family, table, kind, name } => {
                let t = self.table_mut(family, table)?;
                let what = format!("{kind} {family} {table} {name}");
                let exists = match kind {
                    Kind::Chain => t.chains.contains_key(name),
                    Kind::Set | Kind::Map => t.sets.get(name).is_some_and(|s| s.kind == *kind),
                };
                if !exists {
                    return Err(TableError::NotFound { what });
                }
                if let Some(by) = t.referrer(*kind, name) {
                    return Err(TableError::Busy { what, by });
                }
                match kind {
                    Kind::Chain => t.chains.remove(name).map(|_| ()),
                    Kind::Set | Kind::Map => t.sets.remove(name).map(|_| ()),
                };
                Ok(())
            }
            Command::AddRule { family, table, chain, rule } => {
                let t = self.table_mut(family, table)?;
                t.check_rule_refs(rule).map_err(|m| TableError::NotFound { what: format!("rule in chain {chain}: {m}") })?;
                let c = t.chains.get_mut(chain).ok_or_else(|| TableError::NotFound { what: format!("chain {family} {table} {chain}") })?;
                c.rules.push(rule.clone());
                Ok(())
            }
            Command::AddElements { family, table, set, elements } => {
                let t = self.table_mut(family, table)?;
                for e in elements {
                    if let Some(target) = e.verdict.as_deref().and_then(verdict_target)
                        && !t.chains.contains_key(target)
                    {
                        return Err(TableError::NotFound { what: format!("element {} of {set}: chain {target}", e.key) });
                    }
                }
                let s = t.sets.get_mut(set).ok_or_else(|| TableError::NotFound { what: format!("set {family} {table} {set}") })?;
                let arity = s.spec.type_.split(" : ").next().unwrap_or("").split(" . ").count();
                for e in elements {
                    check_element(s, e, arity)
                        .map_err(|message| TableError::Invalid { what: format!("element {} of {set}", e.key), message })?;
                    s.elements.insert(
                        e.key.clone(),
                        ElemState {
                            comment: e.comment.clone(),
                            verdict: e.verdict.clone(),
                            timeout: e.timeout.clone(),
                            expires: e.expires.clone(),
                        },
                    );
                }
                Ok(())
            }
            Command::DeleteElements { family, table, set, elements } => {
                let t = self.table_mut(family, table)?;
                let s = t.sets.get_mut(set).ok_or_else(|| TableError::NotFound { what: format!("set {family} {table} {set}") })?;
                for e in elements {
                    if s.elements.remove(&e.key).is_none() {
                        return Err(TableError::NotFound { what: format!("element {} of {set}", e.key) });
                    }
                }
                Ok(())
            }
        }
    }

    /// The canonical listing of every table.
    pub(crate) fn dump(&self) -> String {
        self.tables.values().map(Table::dump).collect()
    }
}

/// The longest comment nft accepts on any object (libnftnl's `NFTNL_UDATA_COMMENT_MAXLEN`):
/// a longer one fails the whole transaction, so the in-memory model refuses it as well.
pub(crate) const COMMENT_MAX: usize = 128;

fn check_comments(cmd: &Command) -> Result<(), TableError> {
    let too_long = |what: String, c: Option<&str>| match c {
        Some(c) if c.len() > COMMENT_MAX => Err(TableError::Invalid {
            what,
            message: format!("comment too long, {COMMENT_MAX} characters maximum allowed ({} given)", c.len()),
        }),
        _ => Ok(()),
    };
    match cmd {
        Command::AddTable { family, table, comment } => too_long(format!("table {family} {table}"), comment.as_deref()),
        Command::AddChain { family, table, name, spec, .. } => too_long(format!("chain {family} {table} {name}"), spec.comment.as_deref()),
        Command::AddSet { family, table, kind, name, spec, .. } => {
            too_long(format!("{kind} {family} {table} {name}"), spec.comment.as_deref())
        }
        Command::AddRule { chain, rule, .. } => {
            let toks = parse::tokenize(rule).unwrap_or_default();
            for w in toks.windows(2) {
                if let [(parse::Tok::Word("comment"), _), (parse::Tok::Str(c), _)] = w {
                    too_long(format!("rule in chain {chain}"), Some(c))?;
                }
            }
            Ok(())
        }
        Command::AddElements { set, elements, .. } => {
            elements.iter().try_for_each(|e| too_long(format!("element {} of {set}", e.key), e.comment.as_deref()))
        }
        _ => Ok(()),
    }
}

/// The words of a rule, quoted strings left out: a comment (or any string) that reads
/// `@set` or `jump chain` refers to nothing, as for nft.
fn rule_words(rule: &str) -> Vec<&str> {
    let toks = parse::tokenize(rule).unwrap_or_default();
    toks.into_iter().filter_map(|(t, _)| if let parse::Tok::Word(w) = t { Some(w) } else { None }).collect()
}

fn verdict_target(v: &str) -> Option<&str> {
    v.strip_prefix("jump ").or_else(|| v.strip_prefix("goto "))
}

fn check_element(s: &SetState, e: &Elem, arity: usize) -> Result<(), String> {
    if s.kind == Kind::Map && e.verdict.is_none() {
        return Err("a map element needs data".into());
    }
    if s.kind == Kind::Set && e.verdict.is_some() {
        return Err("a set element cannot have data".into());
    }
    let parts = e.key.split(" . ").count();
    if parts != arity {
        return Err(format!("has {parts} fields, the set's type has {arity}"));
    }
    let is_range = |p: &str| -> bool {
        use std::net::IpAddr;
        if p.starts_with('"') {
            return false;
        }
        if let Some((a, b)) = p.split_once('/') {
            return a.parse::<IpAddr>().is_ok() && b.parse::<u8>().is_ok();
        }
        if let Some((a, b)) = p.split_once('-') {
            return (a.parse::<IpAddr>().is_ok() && b.parse::<IpAddr>().is_ok()) || (a.parse::<u16>().is_ok() && b.parse::<u16>().is_ok());
        }
        false
    };
    if !s.spec.flags.iter().any(|f| f == "interval") && e.key.split(" . ").any(is_range) {
        return Err("ranges and prefixes need flags interval".into());
    }
    Ok(())
}

impl Table {
    /// Who refers to `name` (a chain via jump/goto, a set via `@name`), if anyone.
    fn referrer(&self, kind: Kind, name: &str) -> Option<String> {
        for (cname, c) in &self.chains {
            for r in &c.rules {
                let words = rule_words(r);
                let hit = match kind {
                    Kind::Chain => words.windows(2).any(|w| (w[0] == "jump" || w[0] == "goto") && w[1] == name),
                    Kind::Set | Kind::Map => words.iter().any(|w| set_ref(w) == Some(name)),
                };
                if hit {
                    return Some(format!("a rule in chain {cname}"));
                }
            }
        }
        if kind == Kind::Chain {
            for (sname, s) in &self.sets {
                if s.elements.values().any(|e| e.verdict.as_deref().and_then(verdict_target) == Some(name)) {
                    return Some(format!("an element of map {sname}"));
                }
            }
        }
        None
    }

    /// Every `@set` and `jump`/`goto` target of a rule must exist.
    fn check_rule_refs(&self, rule: &str) -> Result<(), String> {
        let words = rule_words(rule);
        for (i, w) in words.iter().enumerate() {
            if let Some(set) = set_ref(w)
                && !self.sets.contains_key(set)
            {
                return Err(format!("set {set} does not exist"));
            }
            if (*w == "jump" || *w == "goto") && i + 1 < words.len() && !self.chains.contains_key(words[i + 1]) {
                return Err(format!("chain {} does not exist", words[i + 1]));
            }
        }
        Ok(())
    }

    /// Canonical text, in the format of `nft -s list table` (objects sorted by kind and name,
    /// elements sorted, one per line), loadable by nft and by [`Ruleset::from_text`].
    pub(crate) fn dump(&self) -> String {
        let mut out = format!("table {} {} {{\n", self.family, self.name);
        if let Some(c) = &self.comment {
            let _ = writeln!(out, "\tcomment \"{c}\"");
        }
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push('\n');
            }
            first = false;
        };
        for kind in [Kind::Set, Kind::Map] {
            for (name, s) in self.sets.iter().filter(|(_, s)| s.kind == kind) {
                sep(&mut out);
                let _ = writeln!(out, "\t{kind} {name} {{");
                let _ = writeln!(out, "\t\ttype {}", s.spec.type_);
                if !s.spec.flags.is_empty() {
                    let _ = writeln!(out, "\t\tflags {}", s.spec.flags.join(","));
                }
                if let Some(l) = &s.spec.limit {
                    let _ = writeln!(out, "\t\tlimit {l}");
                }
                if let Some(c) = &s.spec.comment {
                    let _ = writeln!(out, "\t\tcomment \"{c}\"");
                }
                for (i, (k, e)) in s.elements.iter().enumerate() {
                    out.push_str(if i == 0 { "\t\telements = { " } else { ",\n\t\t\t     " });
                    out.push_str(k);
                    if let Some(c) = &e.comment {
                        let _ = write!(out, " comment \"{c}\"");
                    }
                    if let Some(v) = &e.verdict {
                        let _ = write!(out, " : {v}");
                    }
                }
                if !s.elements.is_empty() {
                    out.push_str(" }\n");
                }
                out.push_str("\t}\n");
            }
        }
        for (name, c) in &self.chains {
            sep(&mut out);
            let _ = writeln!(out, "\tchain {name} {{");
            if let Some(cm) = &c.spec.comment {
                let _ = writeln!(out, "\t\tcomment \"{cm}\"");
            }
            if let Some(h) = &c.spec.hook {
                let _ = writeln!(out, "\t\t{h}");
            }
            for r in &c.rules {
                let _ = writeln!(out, "\t\t{r}");
            }
            out.push_str("\t}\n");
        }
        out.push_str("}\n");
        out
    }

    /// Names of the chains, sets and maps, with their kind.
    pub(crate) fn objects(&self) -> Vec<(Kind, String)> {
        let mut v: Vec<(Kind, String)> = self.sets.iter().map(|(n, s)| (s.kind, n.clone())).collect();
        v.extend(self.chains.keys().map(|n| (Kind::Chain, n.clone())));
        v
    }
}

/// Canonical form of nft text: parse it and dump it again. Two texts describing the same
/// table content (in any object or element order, with any wrapping) have equal canonical
/// forms.
pub fn canonical(text: &str) -> Result<String, TableError> {
    Ok(Ruleset::from_text(text)?.dump())
}

/// The set a rule's word refers to (`@name`); not a raw payload field (`@th,224,16`).
fn set_ref(word: &str) -> Option<&str> {
    let name = word.strip_prefix('@')?;
    let raw = ["ll,", "nh,", "th,", "ih,"]
        .iter()
        .any(|base| name.strip_prefix(base).is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())));
    (!raw).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_back_and_a_note_says_when_an_address_was_learned() {
        for ms in [0, 5, 12_500, 30_000, 3_600_000, 3_725_000, 90_061_001] {
            assert_eq!(duration_ms(&duration_text(ms)), Some(ms), "{}", duration_text(ms));
        }
        assert_eq!(duration_ms("1h2m"), Some(3_720_000));
        assert_eq!(duration_ms(""), None);
        assert_eq!(duration_ms("12x"), None);
        assert_eq!(duration_ms("s"), None);
        let e = |t: &str, x: &str| ElemState {
            comment: Some("api.example.test".into()),
            verdict: None,
            timeout: Some(t.into()),
            expires: Some(x.into()),
        };
        assert_eq!(e("30s", "12s500ms").note(), "api.example.test (learned 17s500ms ago: timeout 30s, expires in 12s500ms)");
        assert_eq!(e("30s", "bogus").note(), "api.example.test (learned: timeout 30s, expires in bogus)");
    }

    const BASE: &str =
        "table inet t {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n\tchain a {\n\t\tip saddr @s accept\n\t}\n\tchain b {\n\t\tjump a\n\t}\n}\n";

    #[test]
    fn transactions_are_all_or_nothing() {
        let mut r = Ruleset::from_text(BASE).unwrap();
        let before = r.clone();
        let e = r.apply_script("add rule inet t a counter drop\nadd rule inet t a jump missing\n").unwrap_err();
        assert!(matches!(e, TableError::NotFound { .. }), "{e}");
        assert_eq!(r, before);
    }

    #[test]
    fn references_are_checked_like_the_kernel() {
        let mut r = Ruleset::from_text(BASE).unwrap();
        assert!(matches!(r.apply_script("delete chain inet t a"), Err(TableError::Busy { .. })));
        assert!(matches!(r.apply_script("delete set inet t s"), Err(TableError::Busy { .. })));
        assert!(matches!(r.apply_script("add rule inet t a ip saddr @nope accept"), Err(TableError::NotFound { .. })));
        assert!(matches!(r.apply_script("flush chain inet t nope"), Err(TableError::NotFound { .. })));
        assert!(matches!(r.apply_script("add set inet t s { type ipv6_addr; }"), Err(TableError::Exists { .. })));
        assert!(matches!(
            r.apply_script("add map inet t m { type ifname : verdict; }\nadd element inet t m { \"x\" : goto nope }"),
            Err(TableError::NotFound { .. })
        ));
        assert!(matches!(r.apply_script("add element inet t s { 10.0.0.0/8 }"), Err(TableError::Invalid { .. })));
        // Flushing the referrers first makes deletion legal, in one transaction.
        r.apply_script("flush chain inet t b\ndelete chain inet t b\nflush chain inet t a\ndelete chain inet t a\ndelete set inet t s\n")
            .unwrap();
        assert!(r.table("inet", "t").unwrap().objects().is_empty());
    }

    #[test]
    fn strings_are_not_references() {
        // Found by the `hostile_strings` fuzzer (fuzz/corpus/hostile_strings/repro-at-sign-in-
        // comment): a namespace named `@` put `@/db` in a rule comment, which was taken for a
        // set reference; a comment naming a chain kept the chain from being deleted.
        let mut r = Ruleset::from_text(BASE).unwrap();
        r.apply_script("add rule inet t a counter comment \"@nope jump nope, @s goto b\"").unwrap();
        r.apply_script("flush chain inet t b\ndelete chain inet t b").unwrap();
        assert!(r.table("inet", "t").unwrap().chains["a"].rules[1].contains("@nope"));
    }

    #[test]
    fn comments_longer_than_nft_allows_are_refused() {
        let long = "x".repeat(COMMENT_MAX + 1);
        let ok = "x".repeat(COMMENT_MAX);
        let mut r = Ruleset::from_text("table inet t {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\n").unwrap();
        for script in [
            format!("add chain inet t c {{ comment \"{long}\"; }}"),
            format!("add set inet t s2 {{ type ipv4_addr; comment \"{long}\"; }}"),
            format!("add rule inet t c counter comment \"{long}\""),
            format!("add element inet t s {{ 198.18.0.1 comment \"{long}\" }}"),
        ] {
            let err = r.clone().apply_script(&script).unwrap_err().to_string();
            assert!(err.contains("comment too long"), "{script}: {err}");
        }
        r.apply_script(&format!("add chain inet t c {{ comment \"{ok}\"; }}\nadd rule inet t c counter comment \"{ok}\"")).unwrap();
    }

    #[test]
    fn comments_of_existing_objects_are_kept() {
        let mut r = Ruleset::from_text("table inet t {\n\tchain a {\n\t\tcomment \"first\"\n\t}\n}\n").unwrap();
        r.apply_script("add chain inet t a { comment \"second\"; }").unwrap();
        assert_eq!(r.table("inet", "t").unwrap().chains["a"].spec.comment.as_deref(), Some("first"));
    }

    #[test]
    fn canonical_form_ignores_order_and_wrapping() {
        let a = "table inet t {\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 198.18.0.2, 198.18.0.1 }\n\t}\n\tchain z {\n\t}\n\tchain a {\n\t}\n}\n";
        let b = "table inet t {\n\tchain a {\n\t}\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 198.18.0.1,\n\t\t\t     198.18.0.2 }\n\t}\n\tchain z {\n\t}\n}\n";
        assert_eq!(canonical(a).unwrap(), canonical(b).unwrap());
        // The dump parses back to itself.
        let d = canonical(a).unwrap();
        assert_eq!(canonical(&d).unwrap(), d);
    }
}
