//! What the kernel holds in table `inet flock`, for drift detection.
//!
//! The kernel backend reads it over netlink ([`NetlinkState`], from
//! [`crate::apply::netlink::dump`]); with transactions through nft (flock-agent `--nft-transactions`) it reads
//! `nft -j -s list table inet flock`: chains (with their rules), sets and maps,
//! each decoded on its own with the `nftables` crate's schema types, handles cleared,
//! elements in a canonical order. Comparing two such states compares what nft *means*, not
//! how its text listing is formatted, so an nft upgrade that prints the same table
//! differently cannot make every node see drift and rewrite its table at once. Maps are
//! kept as their JSON, normalized the same way: crate 0.6.3 has no `verdict` map data type
//! (it reads flock's dispatch maps as sets, dropping the data type). So is any other object
//! the crate cannot decode.
//!
//! The JSON listing omits table and chain comments (nft 1.0.6): edits of those are not
//! drift, which is harmless (they carry no policy). Timed sets' elements are left out: the
//! DNS proxy writes them between flock's transactions (`render::Set::timeout`).

use std::collections::BTreeMap;

use nftables::schema::{Chain, Rule, Set};

use crate::nft::parse::Kind;
use crate::render::names::{FAMILY, TABLE};

/// One object of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectState {
    Chain {
        chain: Chain<'static>,
        rules: Vec<Rule<'static>>,
    },
    Set(Set<'static>),
    /// What the crate cannot decode, as normalized JSON (see the module doc).
    Raw(serde_json::Value),
}

/// The table's objects by kind and name — decoded from nft's JSON listing, or as netlink
/// attributes — or, from the in-memory backend, its canonical dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableState {
    Typed(BTreeMap<(Kind, String), ObjectState>),
    Netlink(NetlinkState),
    Canonical(String),
}

/// The table as the kernel reports it over netlink ([`crate::apply::netlink::dump`]).
///
/// Two states are equal when their table and objects are: the generation says when a state
/// was read, not what it holds.
#[derive(Debug, Clone, Default)]
pub struct NetlinkState {
    /// The ruleset's generation, read before the table: while it stays the same, the table
    /// is still this.
    pub(crate) generation: Generation,
    /// The table's own attributes (flags, comment).
    pub(crate) table: Vec<u8>,
    pub(crate) objects: BTreeMap<(Kind, String), NetlinkObject>,
}

/// A ruleset generation, in the network namespace it counts (a path may come to name another
/// namespace, whose count says nothing of this one's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generation {
    /// The namespace's identity (device and inode of its nsfs file).
    pub(crate) netns: (u64, u64),
    pub(crate) id: u32,
}

impl PartialEq for NetlinkState {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.objects == other.objects
    }
}

impl Eq for NetlinkState {}

/// One chain, set or map as netlink attributes, less what the kernel assigns or counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NetlinkObject {
    pub(crate) declaration: Vec<u8>,
    /// A chain's rules, in order.
    pub(crate) rules: Vec<Vec<u8>>,
    /// A set's or map's elements, sorted; none for a timed set (not read).
    pub(crate) elements: Vec<Vec<u8>>,
}

impl TableState {
    /// How many set elements it holds (of a netlink read; the other forms are small).
    pub(crate) fn elements(&self) -> usize {
        match self {
            Self::Netlink(n) => n.objects.values().map(|o| o.elements.len()).sum(),
            Self::Typed(_) | Self::Canonical(_) => 0,
        }
    }

    /// Parses `nft -j -s list table inet flock` output.
    pub(crate) fn from_json(json: &[u8]) -> Result<Self, super::ApplyError> {
        Self::from_json_inner(json).map_err(super::ApplyError::List)
    }

    fn from_json_inner(json: &[u8]) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Listing {
            nftables: Vec<serde_json::Value>,
        }
        let listing: Listing = serde_json::from_slice(json).map_err(|e| format!("unexpected JSON from nft: {e}"))?;
        let mut objects = BTreeMap::new();
        let mut rules: BTreeMap<String, Vec<Rule<'static>>> = BTreeMap::new();
        for item in listing.nftables {
            let serde_json::Value::Object(map) = item else { continue };
            for (kind, body) in map {
                if body.get("family").and_then(|f| f.as_str()) != Some(FAMILY) {
                    continue;
                }
                let table = if kind == "table" { body.get("name") } else { body.get("table") };
                if table.and_then(|t| t.as_str()) != Some(TABLE) {
                    continue;
                }
                match kind.as_str() {
                    "chain" => {
                        let name = name_of(&body)?;
                        let state = match serde_json::from_value::<Chain<'static>>(body.clone()) {
                            Ok(mut c) => {
                                c.handle = None;
                                ObjectState::Chain { chain: c, rules: Vec::new() }
                            }
                            Err(_) => ObjectState::Raw(normalized(body)),
                        };
                        objects.insert((Kind::Chain, name), state);
                    }
                    "rule" => {
                        let chain = body.get("chain").and_then(|c| c.as_str()).unwrap_or_default().to_string();
                        let mut r: Rule<'static> =
                            serde_json::from_value(body).map_err(|e| format!("a rule of chain {chain} nft listed: {e}"))?;
                        r.handle = None;
                        r.index = None;
                        rules.entry(chain).or_default().push(r);
                    }
                    // Maps as JSON: the crate reads a verdict map as a set, silently
                    // dropping its data type (see the module doc).
                    "map" => {
                        let name = name_of(&body)?;
                        objects.insert((Kind::Map, name), ObjectState::Raw(normalized(body)));
                    }
                    "set" => {
                        let name = name_of(&body)?;
                        let k = Kind::Set;
                        let state = match serde_json::from_value::<Set<'static>>(body.clone()) {
                            Ok(mut s) => {
                                s.handle = None;
                                // A timed set's elements are what the DNS proxy learned (and
                                // their countdowns): not flock's transactions, not drift.
                                if s.flags.as_ref().is_some_and(|f| f.contains(&nftables::schema::SetFlag::Timeout)) {
                                    s.elem = None;
                                }
                                if let Some(elems) = s.elem.take() {
                                    let mut v = elems.into_owned();
                                    v.sort_by_cached_key(|e| serde_json::to_string(e).unwrap_or_default());
                                    s.elem = Some(v.into());
                                }
                                ObjectState::Set(s)
                            }
                            Err(_) => ObjectState::Raw(normalized(body)),
                        };
                        objects.insert((k, name), state);
                    }
                    _ => {}
                }
            }
        }
        for (chain, list) in rules {
            match objects.get_mut(&(Kind::Chain, chain.clone())) {
                Some(ObjectState::Chain { rules, .. }) => *rules = list,
                // A chain only the raw JSON could hold: its rules as JSON beside it.
                Some(ObjectState::Raw(v)) => {
                    if let serde_json::Value::Object(m) = v {
                        m.insert("rules".into(), serde_json::to_value(&list).map_err(|e| e.to_string())?);
                    }
                }
                Some(ObjectState::Set(_)) | None => return Err(format!("nft listed rules of chain {chain}, which it did not list")),
            }
        }
        Ok(Self::Typed(objects))
    }

    /// Where `self` (the kernel now) first differs from `applied`, readably.
    pub(crate) fn first_difference(&self, applied: &Self) -> Option<String> {
        match (self, applied) {
            (Self::Typed(now), Self::Typed(then)) => object_difference(now, then, |_, a, b| describe(a, b)),
            (Self::Netlink(now), Self::Netlink(then)) => {
                if now.table != then.table {
                    return Some("table inet flock's flags or comment changed".into());
                }
                object_difference(&now.objects, &then.objects, describe_netlink)
            }
            (Self::Canonical(now), Self::Canonical(then)) => (now != then).then(|| {
                now.lines()
                    .zip(then.lines())
                    .find(|(a, b)| a != b)
                    .map(|(a, b)| format!("kernel has {:?}, flock applied {:?}", a.trim(), b.trim()))
                    .unwrap_or_else(|| "one listing is longer".into())
            }),
            _ => Some("the listings are of different kinds".into()),
        }
    }
}

/// The first object gone from `then`, added in `now` or different between them, named;
/// `describe` says how one differs.
fn object_difference<V: PartialEq>(
    now: &BTreeMap<(Kind, String), V>,
    then: &BTreeMap<(Kind, String), V>,
    describe: impl Fn(Kind, &V, &V) -> String,
) -> Option<String> {
    if let Some(key) = then.keys().find(|k| !now.contains_key(*k)) {
        return Some(format!("{} {} is gone", kind_name(key.0), key.1));
    }
    for (key, obj) in now {
        let what = format!("{} {}", kind_name(key.0), key.1);
        match then.get(key) {
            None => return Some(format!("{what} was added")),
            Some(o) if o != obj => return Some(format!("{what} differs: {}", describe(key.0, obj, o))),
            Some(_) => {}
        }
    }
    None
}

fn name_of(body: &serde_json::Value) -> Result<String, String> {
    body.get("name").and_then(|n| n.as_str()).map(str::to_string).ok_or_else(|| format!("an object without a name: {body}"))
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Chain => "chain",
        Kind::Set => "set",
        Kind::Map => "map",
    }
}

fn describe(now: &ObjectState, then: &ObjectState) -> String {
    match (now, then) {
        (ObjectState::Chain { chain: a, rules: ra }, ObjectState::Chain { chain: b, rules: rb }) => {
            if a != b {
                "its declaration changed".into()
            } else if ra.len() != rb.len() {
                format!("{} rules, flock applied {}", ra.len(), rb.len())
            } else {
                let i = ra.iter().zip(rb).position(|(x, y)| x != y).unwrap_or(0);
                format!("rule {} changed", i + 1)
            }
        }
        (ObjectState::Set(a), ObjectState::Set(b)) => {
            let (na, nb) = (a.elem.as_ref().map_or(0, |e| e.len()), b.elem.as_ref().map_or(0, |e| e.len()));
            if na != nb { format!("{na} elements, flock applied {nb}") } else { "its elements or declaration changed".into() }
        }
        _ => "its content changed".into(),
    }
}

fn describe_netlink(kind: Kind, now: &NetlinkObject, then: &NetlinkObject) -> String {
    if now.declaration != then.declaration {
        let a: Vec<_> = crate::nfnetlink::raw_attributes(&now.declaration).collect();
        let b: Vec<_> = crate::nfnetlink::raw_attributes(&then.declaration).collect();
        match a.iter().zip(&b).find(|(x, y)| x != y) {
            Some((x, _)) => format!("its declaration changed (netlink attribute {})", x.0),
            None => format!("its declaration changed ({} attributes, flock applied {})", a.len(), b.len()),
        }
    } else if kind == Kind::Chain {
        if now.rules.len() != then.rules.len() {
            format!("{} rules, flock applied {}", now.rules.len(), then.rules.len())
        } else {
            let i = now.rules.iter().zip(&then.rules).position(|(x, y)| x != y).unwrap_or(0);
            format!("rule {} changed", i + 1)
        }
    } else if now.elements.len() != then.elements.len() {
        format!("{} elements, flock applied {}", now.elements.len(), then.elements.len())
    } else {
        "its elements changed".into()
    }
}

/// `v` without handles, with every `elem` list in a canonical order.
fn normalized(mut v: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(m) = &mut v {
        m.remove("handle");
        if let Some(serde_json::Value::Array(elems)) = m.get_mut("elem") {
            elems.sort_by_cached_key(|e| e.to_string());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What nft 1.0.6 prints for a small flock table (trimmed), in one formatting...
    const LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
 {"table": {"family": "inet", "name": "flock", "handle": 1}},
 {"set": {"family": "inet", "name": "pod-addrs-v4", "table": "flock", "type": ["ifname", "ipv4_addr"], "handle": 4, "comment": "c",
   "elem": [{"elem": {"val": {"concat": ["flk53f5ab4becbb", "198.18.1.11"]}, "comment": "x/a"}}, {"elem": {"val": {"concat": ["flk11abb7e5ca4c", "198.18.1.13"]}, "comment": "x/c"}}]}},
 {"map": {"family": "inet", "name": "ingress-chains", "table": "flock", "type": "ifname", "handle": 7, "comment": "m", "map": "verdict",
   "elem": [[{"elem": {"val": "flk4da049fc1971", "comment": "z/c"}}, {"accept": null}], [{"elem": {"val": "flk5fb56d4836e7", "comment": "y/b"}}, {"goto": {"target": "ingress-x"}}]]}},
 {"chain": {"family": "inet", "table": "flock", "name": "to-pods", "handle": 2}},
 {"chain": {"family": "inet", "table": "flock", "name": "forward", "handle": 3, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
 {"rule": {"family": "inet", "table": "flock", "chain": "to-pods", "handle": 11, "expr": [{"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@ingress-chains"}}]}},
 {"rule": {"family": "inet", "table": "flock", "chain": "to-pods", "handle": 12, "comment": "unknown pod interface", "expr": [{"counter": null}, {"drop": null}]}},
 {"rule": {"family": "inet", "table": "flock", "chain": "forward", "handle": 13, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}},
 {"chain": {"family": "inet", "table": "other", "name": "input", "handle": 1}}
]}"#;

    fn state(s: &str) -> TableState {
        TableState::from_json(s.as_bytes()).unwrap()
    }

    #[test]
    fn handles_element_order_and_other_tables_do_not_matter() {
        let a = state(LISTING);
        let TableState::Typed(objects) = &a else { panic!() };
        assert_eq!(objects.len(), 4, "{:?}", objects.keys());
        assert!(matches!(objects[&(Kind::Map, "ingress-chains".to_string())], ObjectState::Raw(_)));
        assert!(matches!(&objects[&(Kind::Chain, "to-pods".to_string())], ObjectState::Chain { rules, .. } if rules.len() == 2));
        // Another nft run: new handles, elements in another order.
        let reordered = LISTING
            .replace("\"handle\": 4", "\"handle\": 40")
            .replace("\"handle\": 11", "\"handle\": 99")
            .replace(
                r#"[{"elem": {"val": {"concat": ["flk53f5ab4becbb", "198.18.1.11"]}, "comment": "x/a"}}, {"elem": {"val": {"concat": ["flk11abb7e5ca4c", "198.18.1.13"]}, "comment": "x/c"}}]"#,
                r#"[{"elem": {"val": {"concat": ["flk11abb7e5ca4c", "198.18.1.13"]}, "comment": "x/c"}}, {"elem": {"val": {"concat": ["flk53f5ab4becbb", "198.18.1.11"]}, "comment": "x/a"}}]"#,
            );
        assert_ne!(reordered, LISTING);
        assert_eq!(state(&reordered).first_difference(&a), None);
    }

    #[test]
    fn real_edits_are_named() {
        let a = state(LISTING);
        let cases = [
            (LISTING.replace(r#"{"counter": null}, {"drop": null}"#, r#"{"counter": null}, {"accept": null}"#), "chain to-pods differs: rule 2 changed"),
            (LISTING.replace(r#"{"accept": null}], [{"elem""#, r#"{"drop": null}], [{"elem""#), "map ingress-chains differs"),
            (LISTING.replace(r#", {"elem": {"val": {"concat": ["flk11abb7e5ca4c", "198.18.1.13"]}, "comment": "x/c"}}"#, ""), "set pod-addrs-v4 differs: 1 elements, flock applied 2"),
            (LISTING.replace(r#" {"rule": {"family": "inet", "table": "flock", "chain": "forward", "handle": 13, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}},
"#, ""), "chain forward differs: 0 rules, flock applied 1"),
        ];
        for (edited, want) in cases {
            assert_ne!(edited, LISTING, "{want}: the edit did not apply");
            let d = state(&edited).first_difference(&a).unwrap_or_default();
            assert!(d.starts_with(want), "{d} (wanted {want})");
        }
    }
}
