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
pub(crate) const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// What is wrong with a domain-name pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a domain name is required")]
    Empty,
    #[error("longer than {MAX_NAME} characters")]
    TooLong,
    #[error("'*' may only be the first label, followed by '.' (\"*.example.com\")")]
    Wildcard,
    #[error("at least two labels are required (\"example.com\", not \"com\")")]
    OneLabel,
    #[error("an empty label (\"..\")")]
    EmptyLabel,
    #[error("the label {0:?} is longer than {MAX_LABEL} characters")]
    LongLabel(String),
    #[error("the label {0:?} has a character other than letters, digits, '-' and '_'")]
    Character(String),
    #[error("the label {0:?} starts or ends with '-'")]
    Hyphen(String),
}

impl DomainPattern {
    /// Parses and validates `text`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let rest = rest.strip_suffix('.').unwrap_or(rest);
        if rest.is_empty() {
            return Err(PatternError::Empty);
        }
        if rest.len() > MAX_NAME {
            return Err(PatternError::TooLong);
        }
        if rest.contains('*') {
            return Err(PatternError::Wildcard);
        }
        let labels: Vec<&str> = rest.split('.').collect();
        if labels.len() < 2 {
            return Err(PatternError::OneLabel);
        }
        for label in &labels {
            check_label(label)?;
        }
        Ok(Self { suffix: rest.to_ascii_lowercase(), wildcard })
    }

    /// Whether `name` (any case, trailing dot or not) is one this pattern admits.
    pub(crate) fn matches(&self, name: &str) -> bool {
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

    pub(crate) fn is_wildcard(&self) -> bool {
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

fn check_label(label: &str) -> Result<(), PatternError> {
    if label.is_empty() {
        return Err(PatternError::EmptyLabel);
    }
    if label.len() > MAX_LABEL {
        return Err(PatternError::LongLabel(label.to_string()));
    }
    if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(PatternError::Character(label.to_string()));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(PatternError::Hyphen(label.to_string()));
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
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
        }
        assert!(DomainPattern::parse(&format!("{}.com", "a".repeat(64))).unwrap_err().to_string().contains("longer than 63"));
        let long = vec!["a".repeat(60); 5].join(".");
        assert!(DomainPattern::parse(&long).unwrap_err().to_string().contains("253"));
    }
}
