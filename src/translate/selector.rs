//! Label selectors: validation exactly as the API server does it, a canonical form (so equal
//! selectors written differently share one nft set), and matching.

use std::collections::BTreeSet;
use std::fmt;

use crate::model::{LabelSelector, Labels, clip};

/// One requirement in canonical form. `matchLabels` entries become `In` with one value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Requirement {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            // NotIn matches pods without the key, as in Kubernetes.
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A validated label selector in canonical form (requirements sorted and de-duplicated).
/// The empty selector selects everything. Shared, not copied, when cloned: peer definitions
/// hold selectors, and every rule naming a peer holds its definition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Selector {
    reqs: std::sync::Arc<[Requirement]>,
}

impl Selector {
    /// The selector that matches every label set.
    pub(crate) fn everything() -> Self {
        Self::default()
    }

    pub(crate) fn is_everything(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Validates and canonicalises `sel`. The error names the offending sub-field
    /// (`matchExpressions[1].operator: ...`), relative to the selector.
    pub(crate) fn compile(sel: &LabelSelector) -> Result<Self, SelectorError> {
        let err = |field: String, message: String| SelectorError { field, message };
        let mut reqs = Vec::with_capacity(sel.match_labels.len() + sel.match_expressions.len());
        for (k, v) in &sel.match_labels {
            validate_label_key(k).map_err(|m| err("matchLabels".into(), format!("key {:?}: {m}", clip(k))))?;
            validate_label_value(v).map_err(|m| err(format!("matchLabels[{k}]"), format!("value {:?}: {m}", clip(v))))?;
            reqs.push(Requirement::In(k.clone(), BTreeSet::from([v.clone()])));
        }
        for (i, e) in sel.match_expressions.iter().enumerate() {
            let at = |field: &str, message: String| err(format!("matchExpressions[{i}].{field}"), message);
            validate_label_key(&e.key).map_err(|m| at("key", format!("{:?}: {m}", clip(&e.key))))?;
            let values = || -> Result<BTreeSet<String>, SelectorError> {
                if e.values.is_empty() {
                    return Err(at("values", format!("must be specified when operator is {}", e.operator)));
                }
                for (j, v) in e.values.iter().enumerate() {
                    validate_label_value(v).map_err(|m| at(&format!("values[{j}]"), format!("{:?}: {m}", clip(v))))?;
                }
                Ok(e.values.iter().cloned().collect())
            };
            let no_values = || -> Result<(), SelectorError> {
                if e.values.is_empty() {
                    Ok(())
                } else {
                    Err(at("values", format!("may not be specified when operator is {}", e.operator)))
                }
            };
            let req = match e.operator.as_str() {
                "In" => Requirement::In(e.key.clone(), values()?),
                "NotIn" => Requirement::NotIn(e.key.clone(), values()?),
                "Exists" => no_values().map(|()| Requirement::Exists(e.key.clone()))?,
                "DoesNotExist" => no_values().map(|()| Requirement::DoesNotExist(e.key.clone()))?,
                other => {
                    return Err(at("operator", format!("{:?} is not In, NotIn, Exists or DoesNotExist", clip(other))));
                }
            };
            reqs.push(req);
        }
        reqs.sort();
        reqs.dedup();
        Ok(Self { reqs: reqs.into() })
    }

    pub(crate) fn matches(&self, labels: &Labels) -> bool {
        self.reqs.iter().all(|r| r.matches(labels))
    }
}

/// Kubernetes' selector string syntax: `app=web,tier in (a,b),!legacy`; `<all>` when empty.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reqs.is_empty() {
            return f.write_str("<all>");
        }
        for (i, r) in self.reqs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let list = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
            match r {
                Requirement::In(k, vs) if vs.len() == 1 => write!(f, "{k}={}", list(vs))?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", list(vs))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", list(vs))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Why a selector is invalid: the sub-field, relative to the selector
/// (`matchExpressions[1].operator`), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub(crate) struct SelectorError {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// Why a label key or value is invalid (the API server's messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("prefix part must be non-empty")]
    EmptyPrefix,
    #[error("prefix part must be a DNS subdomain (lowercase alphanumerics, '-', '.')")]
    Prefix,
    #[error("name part must be non-empty")]
    EmptyName,
    #[error("name part must be at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")]
    Name,
    #[error("must be empty or at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")]
    Value,
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`; alphanumeric at both ends).
pub fn validate_label_key(key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(LabelError::EmptyPrefix);
        }
        if p.len() > 253 || !p.split('.').all(is_subdomain_part) {
            return Err(LabelError::Prefix);
        }
    }
    if name.is_empty() {
        return Err(LabelError::EmptyName);
    }
    if !is_label_name(name) {
        return Err(LabelError::Name);
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters like a key's name part.
pub fn validate_label_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() || is_label_name(value) { Ok(()) } else { Err(LabelError::Value) }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// One dot-separated part of a DNS-1123 subdomain (`IsDNS1123Subdomain`: the whole name is
/// limited to 253 characters, a part has no limit of its own — unlike a DNS-1123 label's 63).
fn is_subdomain_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-') && b[0] != b'-' && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement { key: key.into(), operator: op.into(), values: values.iter().map(|s| s.to_string()).collect() }
    }

    fn sel(ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>) -> Result<Selector, SelectorError> {
        Selector::compile(&LabelSelector { match_labels: labels(ml).to_map(), match_expressions: me })
    }

    #[test]
    fn operators_match_like_kubernetes() {
        type Case<'a> = (LabelSelectorRequirement, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case<'_>] = &[
            (expr("a", "In", &["1", "2"]), &[("a", "2")], true),
            (expr("a", "In", &["1"]), &[("a", "3")], false),
            (expr("a", "In", &["1"]), &[], false),
            (expr("a", "NotIn", &["1"]), &[("a", "2")], true),
            (expr("a", "NotIn", &["1"]), &[("a", "1")], false),
            (expr("a", "NotIn", &["1"]), &[], true),
            (expr("a", "Exists", &[]), &[("a", "")], true),
            (expr("a", "Exists", &[]), &[("b", "x")], false),
            (expr("a", "DoesNotExist", &[]), &[("b", "x")], true),
            (expr("a", "DoesNotExist", &[]), &[("a", "x")], false),
        ];
        for (e, l, want) in cases {
            let s = sel(&[], vec![e.clone()]).unwrap();
            assert_eq!(s.matches(&labels(l)), *want, "{e:?} on {l:?}");
        }
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let s = sel(&[("pod", "a")], vec![expr("tier", "In", &["web"])]).unwrap();
        assert!(s.matches(&labels(&[("pod", "a"), ("tier", "web")])));
        assert!(!s.matches(&labels(&[("pod", "a")])));
        assert!(!s.matches(&labels(&[("pod", "b"), ("tier", "web")])));
    }

    #[test]
    fn empty_selector_selects_everything() {
        let s = sel(&[], vec![]).unwrap();
        assert!(s.is_everything());
        assert!(s.matches(&labels(&[])));
        assert_eq!(s.to_string(), "<all>");
    }

    #[test]
    fn canonical_form_makes_equivalent_selectors_equal() {
        let a = sel(&[("pod", "a")], vec![expr("x", "In", &["2", "1"])]).unwrap();
        let b = sel(&[], vec![expr("x", "In", &["1", "2", "1"]), expr("pod", "In", &["a"])]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "pod=a,x in (1,2)");
        let c = sel(&[], vec![expr("k", "NotIn", &["v"]), expr("e", "Exists", &[]), expr("d", "DoesNotExist", &[])]).unwrap();
        assert_eq!(c.to_string(), "k notin (v),e,!d");
    }

    #[test]
    fn invalid_selectors_are_rejected_with_the_field() {
        let e = sel(&[], vec![expr("a", "Equals", &["1"])]).unwrap_err();
        assert_eq!(e.field, "matchExpressions[0].operator", "{e}");
        let e = sel(&[], vec![expr("a", "In", &[])]).unwrap_err();
        assert!(e.to_string().contains("values: must be specified"), "{e}");
        assert_eq!((e.field.as_str(), e.message.as_str()), ("matchExpressions[0].values", "must be specified when operator is In"));
        let e = sel(&[], vec![expr("a", "Exists", &["x"])]).unwrap_err();
        assert!(e.message.contains("may not be specified"), "{e}");
        let e = sel(&[("k", "bad value!")], vec![]).unwrap_err();
        assert_eq!(e.field, "matchLabels[k]", "{e}");
        assert!(sel(&[("bad key", "v")], vec![]).is_err());
        assert!(sel(&[("k", "bad value!")], vec![]).is_err());
        assert!(sel(&[("Example.COM/k", "v")], vec![]).is_err());
        assert!(sel(&[("example.com/k", "v")], vec![]).is_ok());
        assert!(sel(&[("/k", "v")], vec![]).is_err());
        assert!(sel(&[(&"k".repeat(64), "v")], vec![]).is_err());
        assert!(sel(&[("k", "")], vec![]).is_ok());
        assert!(sel(&[], vec![expr("k", "In", &["ok", "-bad"])]).is_err());
    }

    /// A key prefix is a DNS subdomain: 253 characters in all, with no 63-character limit on
    /// a part (the reference evaluator's differential test found flock rejecting such keys,
    /// which isolated pods the API server would have let a valid selector match).
    #[test]
    fn a_key_prefix_is_a_subdomain_not_a_list_of_dns_labels() {
        let long_part = format!("{}.example.com/role", "a".repeat(70));
        assert!(sel(&[(long_part.as_str(), "v")], vec![]).is_ok());
        assert!(sel(&[(format!("{}/role", "a".repeat(254)).as_str(), "v")], vec![]).is_err());
        assert!(sel(&[("a..b/role", "v")], vec![]).is_err());
        assert!(sel(&[("-a.b/role", "v")], vec![]).is_err());
    }
}
