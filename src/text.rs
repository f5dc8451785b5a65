//! Text from the API or from logs, made safe to print on an operator's terminal. Pure.
//!
//! Anything a FlockNode, a Run, a pod's name or a log line carries was written by someone
//! else: an agent, a controller, or a pod that got its text into an error message. A terminal
//! obeys the control characters in what it prints — an escape sequence can move the cursor and
//! repaint a failed node's row as `ok`, a carriage return can overwrite a line, a newline can
//! forge one, and Unicode's bidirectional controls can reorder what is shown. [`visible`]
//! writes each such character as a visible escape instead (`\u{1b}`, `\n`), the way Rust's
//! `escape_debug` does, and leaves everything else as it is; [`visible_lines`] does the same but
//! keeps line breaks, for text whose lines are the tool's own.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1) or a
/// Unicode format character that reorders or hides text (bidirectional embeddings, overrides
/// and isolates, marks, zero-width characters, the byte-order mark).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}'                    // Arabic letter mark
            | '\u{200b}'..='\u{200f}'     // zero-width space, joiners, LRM, RLM
            | '\u{2028}' | '\u{2029}'     // line and paragraph separators
            | '\u{202a}'..='\u{202e}'     // embeddings and overrides
            | '\u{2060}'..='\u{2064}'     // word joiner, invisible operators
            | '\u{2066}'..='\u{2069}'     // isolates
            | '\u{feff}'                  // byte-order mark, zero-width no-break space
        )
}

/// `s` with every [`is_unsafe`] character written as a visible escape (`\n`, `\t`, `\r`,
/// `\u{1b}`); borrowed when there is none.
pub fn visible(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// [`visible`], but line feeds stay (for text whose lines the caller wrote).
pub fn visible_lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let keep = |c: char| !is_unsafe(c) || (keep_newlines && c == '\n');
    if s.chars().all(keep) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if keep(c) {
            out.push(c);
        } else {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_reordering_characters_are_written_visibly() {
        assert!(matches!(visible("node-1: ok"), Cow::Borrowed(_)));
        // The attack: repaint the line, in green, as an ok node.
        let hostile = "boom\x1b[2K\r\x1b[32mnode-1  ok\x1b[0m";
        let shown = visible(hostile);
        assert_eq!(shown, "boom\\u{1b}[2K\\r\\u{1b}[32mnode-1  ok\\u{1b}[0m");
        assert!(!shown.chars().any(is_unsafe));
        assert_eq!(visible("a\nb\tc\u{7f}\u{9b}"), "a\\nb\\tc\\u{7f}\\u{9b}");
        // Bidirectional overrides ("Trojan source") and zero-width characters.
        assert_eq!(visible("ok\u{202e}KO\u{2066}\u{200b}\u{feff}"), "ok\\u{202e}KO\\u{2066}\\u{200b}\\u{feff}");
        // Other text, Unicode included, is left alone.
        assert_eq!(visible("ünïcødé ✓ 名前"), "ünïcødé ✓ 名前");
        // Lines kept, everything else escaped.
        assert_eq!(visible_lines("a\x1b[1A\nb\r\n"), "a\\u{1b}[1A\nb\\r\n");
    }

    #[test]
    fn every_character_is_either_kept_or_escaped_to_safe_text() {
        for c in (0..=0x10ffffu32).filter_map(char::from_u32).step_by(7).chain(['\u{9b}', '\u{202e}', '\u{2029}']) {
            let s = c.to_string();
            let shown = visible(&s);
            assert!(!shown.chars().any(is_unsafe), "{c:?} -> {shown:?}");
            assert_eq!(shown == s, !is_unsafe(c), "{c:?}");
        }
    }
}
