//! `labelSelector` and `fieldSelector` query parameters: parsing and matching.
//!
//! Label selectors take the equality- and set-based forms (`k=v`, `k==v`, `k!=v`,
//! `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, and `k>n`/`k<n`), ANDed by commas. Field
//! selectors take `field=value`, `field==value` and `field!=value` on `metadata.name`,
//! `metadata.namespace` and the fields a resource declares (e.g. `spec.nodeName` for pods);
//! other fields are rejected, as real API servers do.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::registry::ResourceDef;

/// A malformed or unsupported selector; becomes a 400 `BadRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectorError {
    /// The label selector does not parse.
    #[error("unable to parse requirement {0:?}: {1}")]
    Label(String, &'static str),
    /// The field selector does not parse.
    #[error("invalid field selector {0:?}: {1}")]
    Field(String, &'static str),
    /// The field cannot be selected on for this resource.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<(String, Op)>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_top_level(input) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Self { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object["metadata"]["labels"].as_object();
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|(key, op)| {
            let value = label(key);
            match op {
                Op::Eq(v) => value == Some(v.as_str()),
                Op::NotEq(v) => value != Some(v.as_str()),
                Op::In(set) => value.is_some_and(|x| set.contains(x)),
                Op::NotIn(set) => !value.is_some_and(|x| set.contains(x)),
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
                Op::Gt(n) => value.and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x > *n),
                Op::Lt(n) => value.and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x < *n),
            }
        })
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

fn valid_value(value: &str) -> bool {
    value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn parse_requirement(part: &str) -> Result<(String, Op), SelectorError> {
    let err = |why| SelectorError::Label(part.to_owned(), why);
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) { Ok((key.to_owned(), Op::NotExists)) } else { Err(err("invalid label key")) };
    }
    if let Some(open) = part.find('(') {
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head.as_slice() else { return Err(err("expected `key in (...)` or `key notin (...)`")) };
        let Some(inner) = part[open + 1..].trim_end().strip_suffix(')') else { return Err(err("missing `)`")) };
        let values: BTreeSet<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
        if !valid_key(key) || values.iter().any(|v| !valid_value(v)) {
            return Err(err("invalid label key or value"));
        }
        let op = match *op {
            "in" => Op::In(values),
            "notin" => Op::NotIn(values),
            _ => return Err(err("unknown set operator")),
        };
        return Ok(((*key).to_owned(), op));
    }
    for (token, build) in [("!=", Op::NotEq as fn(String) -> Op), ("==", Op::Eq as fn(String) -> Op), ("=", Op::Eq as fn(String) -> Op)] {
        if let Some((key, value)) = part.split_once(token) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) || !valid_value(value) {
                return Err(err("invalid label key or value"));
            }
            return Ok((key.to_owned(), build(value.to_owned())));
        }
    }
    for (token, greater) in [(">", true), ("<", false)] {
        if let Some((key, value)) = part.split_once(token) {
            let key = key.trim();
            let n: i64 = value.trim().parse().map_err(|_| err("expected an integer"))?;
            if !valid_key(key) {
                return Err(err("invalid label key"));
            }
            return Ok((key.to_owned(), if greater { Op::Gt(n) } else { Op::Lt(n) }));
        }
    }
    if valid_key(part) { Ok((part.to_owned(), Op::Exists)) } else { Err(err("invalid label key")) }
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter, accepting only fields `def` can select on.
    pub fn parse(input: &str, def: &ResourceDef) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in input.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError::Field(part.to_owned(), "expected field=value or field!=value"));
            };
            let field = field.trim();
            if !def.field_selectable(field) {
                return Err(SelectorError::UnsupportedField(field.to_owned()));
            }
            requirements.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self { requirements })
    }

    /// Whether the object's fields satisfy every requirement (missing fields read as `""`).
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(field, equal, want)| {
            let value = field.split('.').try_fold(object, |v, segment| v.get(segment));
            let actual = match value {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *want) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1", "hostNetwork": true}})
    }

    #[test]
    fn label_selectors() {
        let obj = pod(json!({"app": "web", "tier": "front", "n": "7"}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier in (front),!missing", true),
            ("app=web,tier=back", false),
            ("n>5", true),
            ("n<5", false),
        ];
        for (selector, expected) in cases {
            assert_eq!(LabelSelector::parse(selector).unwrap().matches(&obj), expected, "{selector}");
        }
        for bad in ["app in web", "a b", "app=(x", "k in (a", "=x"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selectors() {
        let def = ResourceDef {
            selectable_fields: vec!["spec.nodeName".into(), "spec.hostNetwork".into()],
            ..ResourceDef::new("", "v1", "Pod", "pods", true)
        };
        let obj = pod(json!({}));
        let yes = |s: &str| FieldSelector::parse(s, &def).unwrap().matches(&obj);
        assert!(yes("metadata.name=p"));
        assert!(yes("metadata.namespace==ns,spec.nodeName=n1"));
        assert!(!yes("spec.nodeName!=n1"));
        assert!(yes("spec.hostNetwork=true"));
        assert!(FieldSelector::parse("spec.other=x", &def).is_err());
        assert!(FieldSelector::parse("garbage", &def).is_err());
    }
}
