//! Patch semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and the
//! approximation of server-side apply.
//!
//! Strategic merge patch is served as a merge patch (lists are replaced, not merged by key;
//! `$patch` directives are not interpreted). Server-side apply merges the applied object into
//! the stored one (maps recursively, everything else — lists included — replaced) and tracks,
//! per field manager, the set of leaf paths it applied, as `fieldsV1` in
//! `metadata.managedFields`. That is enough for the behaviours controllers rely on: a
//! field another apply manager owns with a different value is a conflict unless `force`,
//! and a field a manager stops applying is removed when no other manager owns it.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A leaf path in an object (`["spec", "replicas"]`).
pub(crate) type FieldPath = Vec<String>;

/// RFC 7386 merge patch: maps merge recursively, `null` removes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else { return };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Why a JSON patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JsonPatchError {
    /// The body is not an array of operation objects.
    #[error("json patch must be an array of operations")]
    NotAnArray,
    /// An operation lacks a field or names an unknown `op`.
    #[error("invalid operation {index}: {why}")]
    BadOperation { index: usize, why: String },
    /// A path does not resolve.
    #[error("operation {index}: path {path:?} does not exist")]
    NoPath { index: usize, path: String },
    /// A `test` operation failed.
    #[error("operation {index}: test failed at {path:?}")]
    TestFailed { index: usize, path: String },
}

/// RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`).
pub(crate) fn json_patch(target: &Value, ops: &Value) -> Result<Value, JsonPatchError> {
    let ops = ops.as_array().ok_or(JsonPatchError::NotAnArray)?;
    let mut doc = target.clone();
    for (index, op) in ops.iter().enumerate() {
        let bad = |why: &str| JsonPatchError::BadOperation { index, why: why.to_owned() };
        let name = op["op"].as_str().ok_or_else(|| bad("missing op"))?;
        let path = op["path"].as_str().ok_or_else(|| bad("missing path"))?;
        let tokens = pointer_tokens(path).ok_or_else(|| bad("path must start with /"))?;
        let no_path = || JsonPatchError::NoPath { index, path: path.to_owned() };
        let from = || -> Result<(String, Vec<String>), JsonPatchError> {
            let from = op["from"].as_str().ok_or_else(|| bad("missing from"))?;
            Ok((from.to_owned(), pointer_tokens(from).ok_or_else(|| bad("from must start with /"))?))
        };
        match name {
            "add" => {
                let value = op.get("value").ok_or_else(|| bad("missing value"))?.clone();
                add(&mut doc, &tokens, value).ok_or_else(no_path)?;
            }
            "remove" => {
                remove(&mut doc, &tokens).ok_or_else(no_path)?;
            }
            "replace" => {
                let value = op.get("value").ok_or_else(|| bad("missing value"))?.clone();
                let slot = pointer_mut(&mut doc, &tokens).ok_or_else(no_path)?;
                *slot = value;
            }
            "move" => {
                let (from_path, from_tokens) = from()?;
                let value = remove(&mut doc, &from_tokens).ok_or(JsonPatchError::NoPath { index, path: from_path })?;
                add(&mut doc, &tokens, value).ok_or_else(no_path)?;
            }
            "copy" => {
                let (from_path, from_tokens) = from()?;
                let value = pointer(&doc, &from_tokens).cloned().ok_or(JsonPatchError::NoPath { index, path: from_path })?;
                add(&mut doc, &tokens, value).ok_or_else(no_path)?;
            }
            "test" => {
                let value = op.get("value").ok_or_else(|| bad("missing value"))?;
                if pointer(&doc, &tokens) != Some(value) {
                    return Err(JsonPatchError::TestFailed { index, path: path.to_owned() });
                }
            }
            _ => return Err(bad("unknown op")),
        }
    }
    Ok(doc)
}

/// `/a/b~1c` → `["a", "b/c"]`; `""` → `[]`.
fn pointer_tokens(path: &str) -> Option<Vec<String>> {
    if path.is_empty() {
        return Some(Vec::new());
    }
    let rest = path.strip_prefix('/')?;
    Some(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn pointer<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(map) => map.get(t),
        Value::Array(items) => t.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

fn pointer_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(map) => map.get_mut(t),
        Value::Array(items) => t.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

fn add(doc: &mut Value, tokens: &[String], value: Value) -> Option<()> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Some(());
    };
    match pointer_mut(doc, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
        }
        Value::Array(items) => {
            let index = if last == "-" { items.len() } else { last.parse::<usize>().ok()? };
            if index > items.len() {
                return None;
            }
            items.insert(index, value);
        }
        _ => return None,
    }
    Some(())
}

fn remove(doc: &mut Value, tokens: &[String]) -> Option<Value> {
    let (last, parent) = tokens.split_last()?;
    match pointer_mut(doc, parent)? {
        Value::Object(map) => map.remove(last),
        Value::Array(items) => {
            let index = last.parse::<usize>().ok()?;
            (index < items.len()).then(|| items.remove(index))
        }
        _ => None,
    }
}

/// Server-side apply merge: maps merge recursively, `null` removes, anything else (lists
/// included) replaces.
pub(crate) fn apply_merge(target: &mut Value, applied: &Value) {
    merge_patch(target, applied);
}

/// The leaf paths of an applied object: every non-map value, and every empty map.
pub(crate) fn leaf_paths(value: &Value) -> BTreeSet<FieldPath> {
    fn walk(value: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    prefix.push(key.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// The segment of a list-map entry in field paths: `k:{"type":"Ready"}`, as in `fieldsV1`.
fn list_key(key: &str, value: &Value) -> String {
    format!("k:{}", json!({key: value}))
}

/// Turns the list-maps at `list_maps` (path, key field) into maps from each entry's
/// [`list_key`] to the entry, so that the apply rules for maps (merge by key, ownership per
/// field) hold for their entries too. A list with an entry without the key stays a list
/// (atomic).
pub(crate) fn key_list_maps(value: &mut Value, list_maps: &[(FieldPath, String)]) {
    for (path, key) in list_maps {
        let Some(Value::Array(items)) = get_path_mut(value, path) else { continue };
        if !items.iter().all(|i| i.get(key).is_some_and(|k| !k.is_null())) {
            continue;
        }
        let keyed: Map<String, Value> = items.drain(..).map(|i| (list_key(key, &i[key.as_str()]), i)).collect();
        if let Some(slot) = get_path_mut(value, path) {
            *slot = Value::Object(keyed);
        }
    }
}

/// The inverse of [`key_list_maps`]; the entries come back ordered by key. An entry left
/// empty (every field of it was dropped by its manager) is gone.
pub(crate) fn unkey_list_maps(value: &mut Value, list_maps: &[(FieldPath, String)]) {
    for (path, _) in list_maps {
        if let Some(slot) = get_path_mut(value, path)
            && let Value::Object(map) = slot
        {
            let entries = std::mem::take(map).into_iter().map(|(_, v)| v);
            *slot = Value::Array(entries.filter(|v| !v.as_object().is_some_and(Map::is_empty)).collect());
        }
    }
}

fn get_path_mut<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |v, segment| v.get_mut(segment))
}

/// `fieldsV1` of a set of leaf paths: `{"f:spec":{"f:replicas":{}}}`; list-map entries are
/// `k:` segments.
pub(crate) fn fields_v1(paths: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for segment in path {
            let name = if segment.starts_with("k:") { segment.clone() } else { format!("f:{segment}") };
            let entry = node.entry(name).or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else { break };
            node = next;
        }
    }
    Value::Object(root)
}

/// The leaf paths recorded in a `fieldsV1` object (the inverse of [`fields_v1`]); entries
/// other than `f:` and `k:` (e.g. `.` or `v:` written by a real server) end the path there.
pub(crate) fn paths_of_fields_v1(fields: &Value) -> BTreeSet<FieldPath> {
    fn walk(value: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        let children: Vec<(&String, &Value)> =
            value.as_object().map(|m| m.iter().filter(|(k, _)| k.starts_with("f:") || k.starts_with("k:")).collect()).unwrap_or_default();
        if children.is_empty() {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            return;
        }
        for (key, child) in children {
            prefix.push(if key.starts_with("k:") { key.clone() } else { key[2..].to_owned() });
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

/// The value at a path.
pub(crate) fn get_path<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, segment| v.get(segment))
}

/// Removes the value at a path, if any.
pub(crate) fn remove_path(value: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else { return };
    let mut node = value;
    for segment in parent {
        match node.get_mut(segment) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Value::Object(map) = node {
        map.remove(last);
    }
}

/// Whether one path is a prefix of the other (they touch the same field).
pub(crate) fn overlaps(a: &[String], b: &[String]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patch_rfc6902() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        let ops = json!([
            {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "x"},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "remove", "path": "/list/0"},
            {"op": "test", "path": "/list/0", "value": 2},
            {"op": "copy", "from": "/list", "path": "/copy"},
            {"op": "move", "from": "/copy", "path": "/moved"},
        ]);
        let out = json_patch(&doc, &ops).unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"a": "x", "b/c": "2"}}, "list": [2, 3], "moved": [2, 3]}));
        assert!(matches!(json_patch(&doc, &json!([{"op": "remove", "path": "/nope"}])), Err(JsonPatchError::NoPath { .. })));
        assert!(matches!(
            json_patch(&doc, &json!([{"op": "test", "path": "/list/0", "value": 9}])),
            Err(JsonPatchError::TestFailed { .. })
        ));
        assert!(json_patch(&doc, &json!({"op": "add"})).is_err());
    }

    #[test]
    fn fields_v1_round_trip() {
        let obj = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [1], "empty": {}}});
        let paths = leaf_paths(&obj);
        let fields = fields_v1(&paths);
        assert_eq!(fields, json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:ports": {}, "f:empty": {}}}));
        assert_eq!(paths_of_fields_v1(&fields), paths);
    }

    #[test]
    fn list_maps_key_and_unkey() {
        let maps = vec![(vec!["status".to_owned(), "conditions".to_owned()], "type".to_owned())];
        let mut obj = json!({"status": {"conditions": [{"type": "B", "status": "True"}, {"type": "A", "status": "False"}]}});
        key_list_maps(&mut obj, &maps);
        assert_eq!(obj["status"]["conditions"]["k:{\"type\":\"A\"}"]["status"], "False");
        let paths = leaf_paths(&obj);
        assert_eq!(paths_of_fields_v1(&fields_v1(&paths)), paths);
        unkey_list_maps(&mut obj, &maps);
        assert_eq!(obj, json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "True"}]}}));
        // An entry without its key: the list stays atomic.
        let mut atomic = json!({"status": {"conditions": [{"status": "True"}]}});
        key_list_maps(&mut atomic, &maps);
        assert!(atomic["status"]["conditions"].is_array());
    }
}
