//! API strings in flock's own text: warnings, policy problems, errors and log messages.
//!
//! A string from the API (a name, a label key or value, an annotation, a selector value, a
//! field of a manifest) is quoted in flock's messages so the reader can find the object,
//! never repeated whole: the API server bounds what it stores, but manifests and a broken or
//! hostile source do not, and a 10 MB label value must not become a 10 MB warning, problem
//! or log line. Every such string goes through [`clip`]. (nft comments have their own,
//! stricter reduction: `render::names::comment`.)

use std::fmt;

/// The most bytes of an API string that flock repeats. Above every length the API server
/// accepts for a name (253) or a label value (63), so only strings it would never have stored
/// are cut.
pub(crate) const MAX_CLIP: usize = 256;

/// `s` as flock quotes it: at most [`MAX_CLIP`] bytes of it (cut on a character boundary),
/// then, if it was cut, how long it was: `aaaa…(10485760 bytes)`. `{}` writes the kept text
/// as it is, `{:?}` quoted and escaped (the marker after the closing quote, so it cannot be
/// mistaken for part of the value).
pub(crate) fn clip(s: &str) -> Clipped<'_> {
    let mut end = s.len().min(MAX_CLIP);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Clipped { kept: &s[..end], len: s.len() }
}

/// A string as [`clip`] writes it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clipped<'a> {
    kept: &'a str,
    /// The whole string's length in bytes.
    len: usize,
}

impl Clipped<'_> {
    /// Whether part of the string was left out.
    pub(crate) fn is_cut(&self) -> bool {
        self.kept.len() < self.len
    }

    fn marker(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cut() { write!(f, "…({} bytes)", self.len) } else { Ok(()) }
    }
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kept)?;
        self.marker(f)
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.kept, f)?;
        self.marker(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_whole() {
        assert_eq!(clip("web").to_string(), "web");
        assert_eq!(format!("{:?}", clip("a\"b")), r#""a\"b""#);
        let name = "n".repeat(253);
        assert_eq!(clip(&name).to_string(), name);
        assert!(!clip(&"x".repeat(MAX_CLIP)).is_cut());
    }

    #[test]
    fn long_strings_are_cut_with_their_length() {
        let huge = "v".repeat(10 << 20);
        let c = clip(&huge);
        assert!(c.is_cut());
        assert_eq!(c.to_string(), format!("{}…(10485760 bytes)", "v".repeat(MAX_CLIP)));
        assert_eq!(format!("{c:?}"), format!("\"{}\"…(10485760 bytes)", "v".repeat(MAX_CLIP)));
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        // 'é' is two bytes: 255 ASCII bytes then 'é' would straddle the limit.
        let s = format!("{}é{}", "a".repeat(MAX_CLIP - 1), "b".repeat(100));
        let shown = clip(&s).to_string();
        assert_eq!(shown, format!("{}…({} bytes)", "a".repeat(MAX_CLIP - 1), s.len()));
        let wide = "€".repeat(1000);
        let shown = clip(&wide).to_string();
        assert!(shown.starts_with(&"€".repeat(MAX_CLIP / 3)) && shown.ends_with("…(3000 bytes)"), "{shown}");
    }
}
