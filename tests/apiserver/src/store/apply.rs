//! Server-side apply on the store (the merge and field-ownership rules are in `patch`).
//!
//! An apply creates the object when missing; otherwise it checks conflicts with the fields
//! other managers own (409 unless `force`, which takes them over), removes the fields this
//! manager applied before and no longer applies (when no one else owns them), merges the
//! applied configuration, and records the manager's fields in `metadata.managedFields`
//! (one `Apply` entry per manager and subresource).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::{ApplyRequest, Mode, ObjKey, State, Target, check_identity, set_meta};
use crate::{
    meta,
    patch::{self, FieldPath},
    registry::ResourceDef,
    status::ApiError,
};

impl State {
    /// Server-side apply (see the `patch` module for what is approximated).
    pub(super) fn server_side_apply(
        &mut self,
        def: &ResourceDef,
        key: &ObjKey,
        mut applied: Value,
        req: &ApplyRequest<'_>,
    ) -> Result<(Value, bool), ApiError> {
        if !applied.is_object() {
            return Err(ApiError::bad_request("apply patch must be an object"));
        }
        for (field, want) in [("apiVersion", def.api_version()), ("kind", def.kind.clone())] {
            match applied[field].as_str() {
                Some(v) if v == want => {}
                Some(v) => return Err(ApiError::bad_request(format!("{field} {v:?} does not match the request ({want:?})"))),
                None => return Err(ApiError::bad_request(format!("{field} must be set in an apply patch"))),
            }
        }
        check_identity(def, key, &mut applied)?;
        let mut config = apply_config(&applied, def, req.target);
        // List-map entries are merged and owned one by one (by key), like map fields.
        patch::key_list_maps(&mut config, &def.list_maps);
        let new_paths = patch::leaf_paths(&config);
        let subresource = (req.target == Target::Status).then_some("status");
        let entry = |paths: &BTreeSet<FieldPath>| {
            let mut entry = json!({
                "manager": req.manager,
                "operation": "Apply",
                "apiVersion": def.api_version(),
                "time": meta::now_rfc3339(),
                "fieldsType": "FieldsV1",
                "fieldsV1": patch::fields_v1(paths),
            });
            if let (Some(sub), Some(map)) = (subresource, entry.as_object_mut()) {
                map.insert("subresource".into(), sub.into());
            }
            entry
        };
        let Some(old) = self.object(def, key) else {
            if req.target == Target::Status {
                return Err(ApiError::not_found(def, &key.1));
            }
            let mut object = applied;
            set_meta(&mut object, "managedFields", json!([entry(&new_paths)]));
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("resourceVersion");
            }
            return Ok((self.create(def, Some(&key.0), object, Mode::Api, req.dry_run)?, true));
        };
        let asked = applied["metadata"]["resourceVersion"].as_str().unwrap_or_default();
        if !asked.is_empty() && Some(asked) != old["metadata"]["resourceVersion"].as_str() {
            return Err(ApiError::conflict(
                def,
                &key.1,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let is_own = |e: &Value| {
            e["manager"].as_str() == Some(req.manager)
                && e["operation"].as_str() == Some("Apply")
                && e["subresource"].as_str() == subresource
        };
        let mut keyed = old.value.clone();
        patch::key_list_maps(&mut keyed, &def.list_maps);
        let mut managed: Vec<Value> = old["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
        let previous = managed.iter().find(|e| is_own(e)).map(|e| patch::paths_of_fields_v1(&e["fieldsV1"])).unwrap_or_default();
        // Conflicts: fields another manager owns that this apply sets to a different value.
        let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
        for other in managed.iter().filter(|e| !is_own(e)) {
            let owner = other["manager"].as_str().unwrap_or("unknown").to_owned();
            for owned in patch::paths_of_fields_v1(&other["fieldsV1"]) {
                for path in new_paths.iter().filter(|p| patch::overlaps(p, &owned)) {
                    if patch::get_path(&keyed, path) != patch::get_path(&config, path) {
                        conflicts.push((owner.clone(), path.clone()));
                    }
                }
            }
        }
        if !conflicts.is_empty() {
            if !req.force {
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|(owner, path)| {
                        json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{owner}\""), "field": format!(".{}", path.join("."))})
                    })
                    .collect();
                let list: Vec<String> = conflicts.iter().map(|(o, p)| format!("conflict with \"{o}\": .{}", p.join("."))).collect();
                let message = format!("Apply failed with {} conflicts: {}", conflicts.len(), list.join(", "));
                return Err(ApiError::apply_conflict(def, &key.1, message, causes));
            }
            // Forced: the conflicting fields change owner.
            for other in managed.iter_mut().filter(|e| !is_own(e)) {
                let owned = patch::paths_of_fields_v1(&other["fieldsV1"]);
                let kept: BTreeSet<FieldPath> =
                    owned.into_iter().filter(|o| !conflicts.iter().any(|(_, p)| patch::overlaps(p, o))).collect();
                if let Some(map) = other.as_object_mut() {
                    map.insert("fieldsV1".into(), patch::fields_v1(&kept));
                }
            }
            managed.retain(|e| is_own(e) || e["fieldsV1"].as_object().is_some_and(|m| !m.is_empty()));
        }
        let mut candidate = keyed;
        let others: Vec<FieldPath> =
            managed.iter().filter(|e| !is_own(e)).flat_map(|e| patch::paths_of_fields_v1(&e["fieldsV1"])).collect();
        for dropped in previous.difference(&new_paths) {
            if !others.iter().any(|o| patch::overlaps(o, dropped)) {
                patch::remove_path(&mut candidate, dropped);
            }
        }
        patch::apply_merge(&mut candidate, &config);
        patch::unkey_list_maps(&mut candidate, &def.list_maps);
        managed.retain(|e| !is_own(e));
        managed.push(entry(&new_paths));
        set_meta(&mut candidate, "managedFields", Value::Array(managed));
        let out = self.update(def, key, candidate, req.target, Mode::Api, req.dry_run)?;
        Ok((out, false))
    }
}

/// The part of an applied object a manager owns: without `apiVersion`, `kind`, identity and
/// server-set metadata, and without `.status` (main resource) or only `.status` (`/status`).
fn apply_config(applied: &Value, def: &ResourceDef, target: Target) -> Value {
    let mut config = Map::new();
    let Some(obj) = applied.as_object() else { return Value::Object(config) };
    for (key, value) in obj {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "status" if target == Target::Main && def.status_subresource => {}
            "metadata" if target == Target::Main => {
                let mut meta = value.as_object().cloned().unwrap_or_default();
                for server_field in [
                    "name",
                    "namespace",
                    "uid",
                    "resourceVersion",
                    "generation",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "managedFields",
                    "selfLink",
                ] {
                    meta.remove(server_field);
                }
                if !meta.is_empty() {
                    config.insert(key.clone(), Value::Object(meta));
                }
            }
            "status" => {
                config.insert(key.clone(), value.clone());
            }
            _ if target == Target::Main => {
                config.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    Value::Object(config)
}
