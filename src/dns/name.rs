//! Domain names as policies write them (the `DomainName` of network-policy-api's NPEP-133,
//! for ClusterNetworkPolicy `domainNames` and RunProfile `domains`) and as DNS answers carry
//! them.
//!
//! A pattern is an exact name or `*.` followed by a name; `*` matches one or more whole
//! labels (`*.example.com` matches `a.example.com` and `a.b.example.com`, never
//! `example.com`). Names are compared case-insensitively and a trailing dot is ignored.
//! What a pattern may contain is the API's: at least two labels of letters, digits, `-` and
//! `_`, each 1–63 characters, not starting or ending with `-`, at most 253 characters.
//! Anything else is refused with the reason (a policy naming it then fails closed).

use std::fmt;

/// A validated domain-name pattern, stored lowercase without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainPattern {
    /// The name after the `*.` (wildcards) or the whole name, lowercase, no trailing dot.
    suffix: String,
    wildcard: bool,
}

/// The longest name DNS carries (RFC 1035), in its dotted text form.
pub const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

impl DomainPattern {
    /// Parses and validates `text`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let rest = rest.strip_suffix('.').unwrap_or(rest);
        if rest.is_empty() {
            return Err("a domain name is required".into());
        }
        if rest.len() > MAX_NAME {
            return Err(format!("longer than {MAX_NAME} characters"));
        }
        if rest.contains('*') {
            return Err("'*' may only be the first label, followed by '.' (\"*.example.com\")".into());
        }
        let labels: Vec<&str> = rest.split('.').collect();
        if labels.len() < 2 {
            return Err("at least two labels are required (\"example.com\", not \"com\")".into());
        }
        for label in &labels {
            check_label(label)?;
        }
        Ok(Self { suffix: rest.to_ascii_lowercase(), wildcard })
    }

    /// Whether `name` (any case, trailing dot or not) is one this pattern admits.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        if !self.wildcard {
            return name.eq_ignore_ascii_case(&self.suffix);
        }
        // One or more whole labels before the suffix: "<labels>.<suffix>".
        let Some(split) = name.len().checked_sub(self.suffix.len() + 1) else { return false };
        let (head, tail) = name.split_at(split);
        !head.is_empty()
            && tail.as_bytes().first() == Some(&b'.')
            && tail.get(1..).is_some_and(|t| t.eq_ignore_ascii_case(&self.suffix))
            && head.split('.').all(|l| !l.is_empty())
    }

    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.suffix)
    }
}

fn check_label(label: &str) -> Result<(), String> {
    if label.is_empty() {
        return Err("an empty label (\"..\")".into());
    }
    if label.len() > MAX_LABEL {
        return Err(format!("the label {label:?} is longer than {MAX_LABEL} characters"));
    }
    if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("the label {label:?} has a character other than letters, digits, '-' and '_'"));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(format!("the label {label:?} starts or ends with '-'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    #[test]
    fn exact_names_ignore_case_and_a_trailing_dot() {
        let github = p("GitHub.com.");
        assert_eq!(github.to_string(), "github.com");
        for yes in ["github.com", "GITHUB.COM", "github.com."] {
            assert!(github.matches(yes), "{yes}");
        }
        for no in ["api.github.com", "github.co", "xgithub.com", "github.com.evil", ""] {
            assert!(!github.matches(no), "{no}");
        }
    }

    #[test]
    fn wildcards_match_one_or_more_whole_labels() {
        let pypi = p("*.pypi.org");
        assert!(pypi.is_wildcard());
        for yes in ["files.pypi.org", "a.b.pypi.org", "FILES.PyPI.org.", "x_y.pypi.org"] {
            assert!(pypi.matches(yes), "{yes}");
        }
        for no in ["pypi.org", "pypi.org.", "xpypi.org", ".pypi.org", "a..pypi.org", "files.pypi.org.evil", "pypi.org.files"] {
            assert!(!pypi.matches(no), "{no}");
        }
    }

    #[test]
    fn invalid_patterns_say_why() {
        for (bad, why) in [
            ("", "required"),
            ("*.", "required"),
            ("com", "two labels"),
            ("*.com", "two labels"),
            ("a.*.com", "'*' may only"),
            ("*example.com", "'*' may only"),
            ("**.example.com", "'*' may only"),
            ("a..com", "empty label"),
            ("-a.com", "starts or ends"),
            ("a b.com", "character"),
            ("exämple.com", "character"),
        ] {
            let e = DomainPattern::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(DomainPattern::parse(&format!("{}.com", "a".repeat(64))).unwrap_err().contains("longer than 63"));
        let long = vec!["a".repeat(60); 5].join(".");
        assert!(DomainPattern::parse(&long).unwrap_err().contains("253"));
    }
}
