//! Every name and comment that reaches nft is made here.
//!
//! Dynamic names are `<purpose>-<HASH8>-<human>`, kube-proxy style: the hash (8 base32
//! characters of SHA-256) covers the object's whole identity — its definition *and* its
//! comment — because the kernel keeps the first comment a chain or set was created with and
//! ignores later ones: anything that would change a comment must change the name. The human
//! part is for the operator only and is reduced to characters nft accepts in an unquoted
//! identifier (`a-z 0-9 . _ / -`). Dynamic names contain a `/` and static ones never do, so
//! the two can be told apart.
//!
//! Comments are reduced to printable ASCII without `"` and `\` (nft has no escapes inside a
//! quoted string) and cut at the kernel's 128 bytes with a hash suffix, so no API string can
//! ever become nft syntax.

use sha2::{Digest, Sha256};

/// The nft family and table flock owns.
pub const FAMILY: &str = "inet";
pub const TABLE: &str = "flock";

/// nft rejects comments longer than this (bytes); the in-memory nft holds the same limit.
pub(crate) const MAX_COMMENT: usize = crate::nft::table::COMMENT_MAX;
/// Human part of dynamic names is cut to this length; with the purpose and hash, names stay
/// far below the kernel's 255 bytes and readable in `nft list`.
pub(crate) const MAX_HUMAN: usize = 48;

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// 8 base32 characters of SHA-256 over `parts` (NUL-separated, so part boundaries count).
pub(crate) fn hash8(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    let d = h.finalize();
    // 40 bits → 8 characters of 5 bits.
    let bits = d.iter().take(5).fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    (0..8).rev().map(|i| char::from(BASE32[((bits >> (i * 5)) & 31) as usize])).collect()
}

/// `<purpose>-<HASH8>-<human>` where the hash covers `identity`.
pub(crate) fn dynamic(purpose: &str, identity: &[&str], human: &str) -> String {
    let mut parts = Vec::with_capacity(identity.len() + 1);
    parts.push(purpose);
    parts.extend_from_slice(identity);
    format!("{purpose}-{}-{}", hash8(&parts), human_part(human))
}

/// Reduces `s` to `[a-z0-9._/-]` (uppercase folded, `=` → `.`, `:` → `-`, everything else
/// `_`), at most
/// [`MAX_HUMAN`] bytes.
pub(crate) fn human_part(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '/' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            '=' => '.',
            ':' => '-',
            _ => '_',
        })
        .take(MAX_HUMAN)
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// A comment nft accepts for any input: printable ASCII without `"` and `\`, at most
/// [`MAX_COMMENT`] bytes (longer text is cut and marked with a hash of the whole).
pub(crate) fn comment(s: &str) -> String {
    if s.len() <= MAX_COMMENT && s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\') {
        return s.to_string(); // already clean: the common case, without the per-character walk
    }
    let clean: String = s.chars().map(|c| if (' '..='~').contains(&c) && c != '"' && c != '\\' { c } else { '?' }).collect();
    if clean.len() <= MAX_COMMENT {
        return clean;
    }
    let suffix = format!("..#{}", hash8(&[s]));
    let keep = MAX_COMMENT - suffix.len();
    format!("{}{suffix}", &clean[..keep])
}

/// A quoted nft string for a value flock itself produced or validated (interface names).
pub(crate) fn quoted(s: &str) -> String {
    format!("\"{}\"", comment(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_base32() {
        let h = hash8(&["a", "b"]);
        assert_eq!(h.len(), 8);
        assert!(h.bytes().all(|b| BASE32.contains(&b)));
        assert_eq!(h, hash8(&["a", "b"]));
        assert_ne!(h, hash8(&["ab"]));
    }

    #[test]
    fn dynamic_names_are_safe_identifiers() {
        let n = dynamic("peers-v4", &["def"], "x/pod=a,tier in (web)\"; drop; #");
        assert!(n.starts_with("peers-v4-"));
        assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._/-".contains(&b) || b.is_ascii_uppercase()));
        assert!(!n.contains('"') && !n.contains(';') && !n.contains(' '));
        let long = dynamic("ingress", &["x"], &"a".repeat(1000));
        assert!(long.len() <= "ingress".len() + 10 + MAX_HUMAN);
        assert_eq!(dynamic("p", &["a"], ""), format!("p-{}-_", hash8(&["p", "a"])));
    }

    #[test]
    fn comments_never_break_out() {
        assert_eq!(comment("x/a"), "x/a");
        assert_eq!(comment("a\"b\\c\nd\u{e9}"), "a?b?c?d?");
        let long = comment(&"z".repeat(500));
        assert_eq!(long.len(), MAX_COMMENT);
        assert!(long.contains("..#"));
        // Different long inputs with a common prefix stay distinguishable.
        assert_ne!(comment(&format!("{}1", "z".repeat(300))), comment(&format!("{}2", "z".repeat(300))));
    }
}
