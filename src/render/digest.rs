//! The SHA-256 of a ruleset, as FlockNode reports it: the ruleset's derived [`Hash`] fed
//! into SHA-256 instead of a hash map's hasher. Integers go in little-endian and `usize` as
//! 64 bits, so equal rulesets give the same digest on every node, whatever its platform, and
//! no text is built for it.

use std::hash::{Hash, Hasher};

use sha2::{Digest, Sha256};

use super::Ruleset;

/// A [`Hasher`] writing everything it is given into SHA-256, platform-independently.
#[derive(Default)]
pub(crate) struct Sha256Hasher(Sha256);

impl Sha256Hasher {
    /// The digest, as 64 lowercase hex digits.
    pub(crate) fn hex(self) -> String {
        self.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Not a digest: `Hasher` wants a `u64`, SHA-256 gives more ([`Self::hex`] is the digest).
    fn finish(&self) -> u64 {
        let d = self.0.clone().finalize();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }

    // The defaults write native-endian bytes (and `usize` at the platform's width).
    fn write_u16(&mut self, i: u16) {
        self.write(&i.to_le_bytes());
    }
    fn write_u32(&mut self, i: u32) {
        self.write(&i.to_le_bytes());
    }
    fn write_u64(&mut self, i: u64) {
        self.write(&i.to_le_bytes());
    }
    fn write_u128(&mut self, i: u128) {
        self.write(&i.to_le_bytes());
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_i16(&mut self, i: i16) {
        self.write(&i.to_le_bytes());
    }
    fn write_i32(&mut self, i: i32) {
        self.write(&i.to_le_bytes());
    }
    fn write_i64(&mut self, i: i64) {
        self.write(&i.to_le_bytes());
    }
    fn write_i128(&mut self, i: i128) {
        self.write(&i.to_le_bytes());
    }
    fn write_isize(&mut self, i: isize) {
        self.write_i64(i as i64);
    }
}

/// The ruleset's SHA-256 (64 hex digits): equal rulesets, equal digests.
pub fn sha256(ruleset: &Ruleset) -> String {
    let mut h = Sha256Hasher::default();
    ruleset.hash(&mut h);
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{Chain, Object, Rule, Stmt, Verdict};

    fn ruleset(rule: Rule) -> Ruleset {
        Ruleset {
            comment: "c".into(),
            objects: vec![Object::Chain(Chain { name: "x".into(), comment: "x".into(), hook: None, rules: vec![rule].into() })],
        }
    }

    #[test]
    fn equal_rulesets_have_equal_digests_and_different_ones_differ() {
        let a = sha256(&ruleset(Rule::verdict(Verdict::Accept)));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{a}");
        assert_eq!(a, sha256(&ruleset(Rule::verdict(Verdict::Accept))));
        assert_ne!(a, sha256(&ruleset(Rule::verdict(Verdict::Drop))));
        // Structure counts: one rule "counter accept" is not two rules "counter", "accept".
        let mut two = ruleset(Rule::new(vec![Stmt::Counter], None));
        if let Object::Chain(c) = &mut two.objects[0] {
            std::sync::Arc::make_mut(&mut c.rules).push(Rule::verdict(Verdict::Accept));
        }
        assert_ne!(sha256(&ruleset(Rule::new(vec![Stmt::Counter], Some(Verdict::Accept)))), sha256(&two));
    }

    /// A change to how rulesets hash (here or in std's `Hash` for `str` and `Vec`) changes
    /// every node's reported hash at an upgrade: it must be deliberate.
    #[test]
    fn the_digest_is_pinned() {
        // SHA-256 of `ff 00 00 00 00 00 00 00 00`: the empty comment (`str` hashes its bytes,
        // then 0xff) and an empty object list (its length as 8 little-endian bytes).
        let empty = Ruleset { comment: String::new(), objects: vec![] };
        assert_eq!(sha256(&empty), "706590b13eb1c33d4a62744a4615e95e6841cdec4aeb6479412f0744fe9c57a5");
    }
}
