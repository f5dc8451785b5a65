//! Elements of flock's sets and verdict maps, typed: each key part is an interface name, an
//! address or prefix, a protocol or a port range, and a map's data is a [`Verdict`]. The
//! printer ([`Element::write`]) writes them as nft text; the netlink encoder
//! (`crate::apply::netlink`) turns the same values into key bytes, without reading text.

use std::fmt::{self, Write as _};
use std::net::IpAddr;

use super::names::quoted;
use super::rule::{Proto, Verdict};

/// One part of an element's key, of the set's key type at its position.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    /// A pod's host interface (`ifname`), written quoted.
    Ifname(String),
    /// An address (`ipv4_addr`, `ipv6_addr`).
    Addr(IpAddr),
    /// A prefix of an interval set; a host prefix is written as its address, as nft lists it.
    Net(ipnet::IpNet),
    /// A transport protocol (`inet_proto`).
    Proto(Proto),
    /// A port, or in an interval set an inclusive range of them (`inet_service`).
    Ports(u16, u16),
    /// An address or prefix in a raw payload field (a `typeof @th,…` key part: the source
    /// inside a VXLAN frame), written as nft writes integers: hex, a prefix as a range.
    Raw(ipnet::IpNet),
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ifname(name) => f.write_str(&quoted(name)),
            Self::Addr(a) => write!(f, "{a}"),
            Self::Net(n) if n.prefix_len() == n.max_prefix_len() => write!(f, "{}", n.addr()),
            Self::Net(n) => write!(f, "{n}"),
            Self::Proto(p) => f.write_str(p.keyword()),
            Self::Ports(a, b) if a == b => write!(f, "{a}"),
            Self::Ports(a, b) => write!(f, "{a}-{b}"),
            Self::Raw(n) => match crate::translate::net_ints(n) {
                (a, b) if a == b => write!(f, "{a:#x}"),
                (a, b) => write!(f, "{a:#x}-{b:#x}"),
            },
        }
    }
}

/// An element's key: its parts, concatenated (` . `) when the set's key has more than one.
/// A one-part key (most elements: an address, a prefix, an interface) is held inline: a set
/// can hold a cluster's pods, one key each.
#[derive(Debug, Clone)]
pub struct Key(Parts);

#[derive(Debug, Clone)]
enum Parts {
    One(KeyPart),
    Many(Vec<KeyPart>),
}

impl Key {
    pub fn one(part: KeyPart) -> Self {
        Self(Parts::One(part))
    }

    pub fn new(mut parts: Vec<KeyPart>) -> Self {
        if parts.len() == 1
            && let Some(part) = parts.pop()
        {
            return Self::one(part);
        }
        Self(Parts::Many(parts))
    }

    pub fn parts(&self) -> &[KeyPart] {
        match &self.0 {
            Parts::One(part) => std::slice::from_ref(part),
            Parts::Many(parts) => parts,
        }
    }
}

// By the parts, whatever the storage.
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(other.parts())
    }
}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts().iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

/// An element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    pub key: Key,
    pub comment: String,
    /// For verdict maps: `accept`, `jump <chain>`, `goto <chain>`.
    pub verdict: Option<Verdict>,
}

impl Element {
    /// The element as nft writes it inside `elements = { ... }` or `add element`.
    pub(crate) fn write(&self, out: &mut String) {
        let _ = write!(out, "{} comment \"{}\"", self.key, self.comment);
        if let Some(v) = &self.verdict {
            let _ = write!(out, " : {v}");
        }
    }
}

/// Sorts `v` in the order of its elements' text — key, comment, verdict: the order flock has
/// always written exact sets in, which the goldens keep.
pub(crate) fn sort_as_written(v: &mut Vec<Element>) {
    let mut keyed: Vec<(String, Element)> = v.drain(..).map(|e| (e.key.to_string(), e)).collect();
    keyed
        .sort_by(|(ka, a), (kb, b)| ka.cmp(kb).then_with(|| a.comment.cmp(&b.comment)).then_with(|| verdict_text(a).cmp(&verdict_text(b))));
    v.extend(keyed.into_iter().map(|(_, e)| e));
}

fn verdict_text(e: &Element) -> Option<String> {
    e.verdict.as_ref().map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_as_nft_lists_them() {
        let k = Key::new(vec![KeyPart::Ifname("flk0a".into()), KeyPart::Proto(Proto::Tcp), KeyPart::Ports(8000, 8099)]);
        assert_eq!(k.to_string(), "\"flk0a\" . tcp . 8000-8099");
        assert_eq!(KeyPart::Ports(80, 80).to_string(), "80");
        assert_eq!(KeyPart::Net("198.18.1.7/32".parse().unwrap()).to_string(), "198.18.1.7");
        assert_eq!(KeyPart::Net("2001:db8::/32".parse().unwrap()).to_string(), "2001:db8::/32");
        // As `nft list` prints a raw field: hex, unpadded.
        assert_eq!(KeyPart::Raw("10.0.0.0/8".parse().unwrap()).to_string(), "0xa000000-0xaffffff");
        assert_eq!(KeyPart::Raw("0.0.0.5/32".parse().unwrap()).to_string(), "0x5");
        assert_eq!(KeyPart::Raw("2001:db8::1/128".parse().unwrap()).to_string(), "0x20010db8000000000000000000000001");
        let mut out = String::new();
        Element { key: Key::one(KeyPart::Ifname("flk1".into())), comment: "x/a".into(), verdict: Some(Verdict::Goto("c".into())) }
            .write(&mut out);
        assert_eq!(out, "\"flk1\" comment \"x/a\" : goto c");
    }

    #[test]
    fn keys_compare_by_their_parts_however_built() {
        let part = || KeyPart::Addr("198.18.1.7".parse().unwrap());
        assert_eq!(Key::new(vec![part()]), Key::one(part()));
        assert_eq!(Key::new(vec![part()]).parts(), [part()]);
        let two = Key::new(vec![part(), KeyPart::Proto(Proto::Tcp)]);
        assert_eq!(two.parts().len(), 2);
        // As the parts order: the first part decides before the count of parts.
        let later = Key::one(KeyPart::Addr("198.18.1.8".parse().unwrap()));
        assert!(two < later && Key::one(part()) < two);
        assert!(Key::new(Vec::new()).parts().is_empty());
    }

    #[test]
    fn sorting_follows_the_text() {
        let e = |a: &str, c: &str| Element { key: Key::one(KeyPart::Addr(a.parse().unwrap())), comment: c.into(), verdict: None };
        let mut v = vec![e("198.18.1.10", "b"), e("198.18.1.9", "a"), e("198.18.1.10", "a")];
        sort_as_written(&mut v);
        // As text, "198.18.1.10" < "198.18.1.9".
        assert_eq!(v, vec![e("198.18.1.10", "a"), e("198.18.1.10", "b"), e("198.18.1.9", "a")]);
    }
}
