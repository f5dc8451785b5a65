//! HTTP: routing Kubernetes API paths to the store, query and body parsing, and responses.
//!
//! Served paths: `/version`; discovery (`/api`, `/api/v1`, `/apis`, `/apis/{g}`,
//! `/apis/{g}/{v}`, and the aggregated form of `/api` and `/apis` when the `Accept` header
//! asks for `APIGroupDiscoveryList`); collections `/api/v1/{plural}`,
//! `/api/v1/namespaces/{ns}/{plural}` and their `/apis/{g}/{v}/…` forms (GET list or watch,
//! POST, DELETE collection); objects `…/{plural}/{name}` (GET, PUT, PATCH, DELETE) and
//! `…/{plural}/{name}/status` (GET, PUT, PATCH); and the legacy `/api/v1/watch/…` prefix.
//! Requests whose `Accept` asks for `PartialObjectMetadata` get metadata-only objects, as
//! kube's `Api<PartialObjectMeta<K>>` expects. Faults (`slow`, `unavailable`, `fail_next`,
//! `garbage`) are applied here, and every request is logged.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::debug;

use crate::{
    faults::RequestRecord,
    patch,
    registry::ResourceDef,
    selector::{FieldSelector, LabelSelector},
    server::Shared,
    status::ApiError,
    store::{ApplyRequest, ListPage, ListQuery, ObjKey, Preconditions, Target, WatchFilter, WatchQuery},
    watch::watch_stream,
};

/// Response body: a whole JSON document, or a watch stream.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

const JSON: &str = "application/json";

/// Handles one request (never fails: errors become `Status` responses).
pub(crate) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let at = std::time::SystemTime::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let params = Params::parse(&query);
    let watch = params.get("watch").is_some_and(|w| w == "true" || w == "1") || path.contains("/watch/");
    if let Some(delay) = shared.faults.slow() {
        tokio::time::sleep(delay).await;
    }
    let response = if shared.faults.unavailable() {
        error_response(&ApiError::unavailable())
    } else if let Some(code) = shared.faults.take_failure(&method, &path, watch) {
        error_response(&ApiError::injected(code))
    } else {
        route(&shared, req, &path, &params).await.unwrap_or_else(|err| error_response(&err))
    };
    let status = response.status().as_u16();
    debug!(%method, %path, %query, status, "request");
    shared.log.push(RequestRecord { method, path, query, status, watch, at, elapsed: started.elapsed() });
    Ok(response)
}

/// Decoded query parameters (the last value of a repeated name wins).
#[derive(Debug, Default)]
pub(crate) struct Params(HashMap<String, String>);

impl Params {
    fn parse(query: &str) -> Self {
        Self(form_urlencoded::parse(query.as_bytes()).into_owned().collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("" | "false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!("invalid boolean {name}={other:?}"))),
        }
    }

    fn number(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid integer {name}={v:?}"))))
            .transpose()
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!("unsupported dryRun {other:?}: only \"All\""))),
        }
    }

    fn labels(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.get("labelSelector").unwrap_or_default()).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    fn fields(&self, def: &ResourceDef) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.get("fieldSelector").unwrap_or_default(), def).map_err(|e| ApiError::bad_request(e.to_string()))
    }
}

/// A JSON response with `Content-Type: application/json`.
fn json_response(code: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(JSON));
    response
}

fn value_response(code: u16, value: &Value) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(body) => json_response(code, body),
        Err(err) => error_response(&ApiError::internal(format!("failed to encode response: {err}"))),
    }
}

/// The `Status` response of an error.
pub(crate) fn error_response(err: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(&err.to_status()).unwrap_or_else(|_| b"{\"kind\":\"Status\"}".to_vec());
    json_response(err.code, body)
}

/// What the `garbage` fault answers reads with: a 200 whose body is not JSON.
fn garbage_response(def: &ResourceDef) -> Response<Body> {
    json_response(200, format!("{{\"kind\":\"{}List\",\"items\":[{{\"metadata\": <<garbage>>", def.kind).into_bytes())
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>, path: &str, params: &Params) -> Result<Response<Body>, ApiError> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let discovery = |value: Option<Value>| -> Result<Response<Body>, ApiError> {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed(req.method()));
        }
        value.map(|v| value_response(200, &v)).ok_or_else(ApiError::no_route)
    };
    let aggregated = req.headers().get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("as=APIGroupDiscoveryList")));
    let store = &shared.store;
    match segments.as_slice() {
        ["version"] => discovery(Some(version_info())),
        ["api"] if aggregated => discovery(Some(store.with_registry(|r| r.aggregated(true)))),
        ["api"] => discovery(Some(store.with_registry(|r| r.api_versions()))),
        ["apis"] if aggregated => discovery(Some(store.with_registry(|r| r.aggregated(false)))),
        ["apis"] => discovery(Some(store.with_registry(|r| r.group_list()))),
        ["api", "v1"] => discovery(store.with_registry(|r| r.resource_list("", "v1"))),
        ["apis", group] => discovery(store.with_registry(|r| r.group(group))),
        ["apis", group, version] => discovery(store.with_registry(|r| r.resource_list(group, version))),
        ["api", "v1", rest @ ..] => resource(shared, req, "", "v1", rest, params).await,
        ["apis", group, version, rest @ ..] => resource(shared, req, group, version, rest, params).await,
        _ => Err(ApiError::no_route()),
    }
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-flock-test-apiserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "none",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// A request under `/api/v1/` or `/apis/{g}/{v}/`.
async fn resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
    params: &Params,
) -> Result<Response<Body>, ApiError> {
    let (rest, watch_prefix) = match rest {
        ["watch", rest @ ..] => (rest, true),
        _ => (rest, false),
    };
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => (Some(*ns), *plural, tail),
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return Err(ApiError::no_route()),
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(*name), None),
        [name, sub] => (Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_route()),
    };
    let def = shared.store.resolve(group, version, plural).ok_or_else(ApiError::no_route)?;
    if (namespace.is_some() && !def.namespaced) || (namespace.is_none() && def.namespaced && name.is_some()) {
        return Err(ApiError::no_route());
    }
    let target = match subresource {
        None => Target::Main,
        Some("status") if def.status_subresource => Target::Status,
        Some(_) => return Err(ApiError::no_route()),
    };
    let watch = watch_prefix || params.flag("watch")?;
    let metadata_only =
        req.headers().get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("as=PartialObjectMetadata")));
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default();
    let limit = shared.config.max_body_bytes;
    let store = &shared.store;
    let dry_run = params.dry_run()?;
    let key = |name: &str| -> ObjKey { (namespace.unwrap_or_default().to_owned(), name.to_owned()) };
    match (name, method) {
        (None, Method::GET) if watch => start_watch(shared, def, namespace, None, params, metadata_only),
        // The deprecated watch of one object by path.
        (Some(name), Method::GET) if watch && target == Target::Main => {
            start_watch(shared, def, namespace, Some(name), params, metadata_only)
        }
        (None, Method::GET) => {
            if shared.faults.garbage() {
                return Ok(garbage_response(&def));
            }
            let page = store.list(&def, namespace, &list_query(&def, params)?)?;
            Ok(json_response(200, list_body(&def, &page, metadata_only)))
        }
        (None, Method::POST) => {
            let body = read_json(req, limit, &content_type).await?;
            let created = store.create(&def, namespace, body, crate::store::Mode::Api, dry_run)?;
            Ok(value_response(201, &created))
        }
        (None, Method::DELETE) => {
            let deleted = store.delete_collection(&def, namespace, &list_query(&def, params)?, dry_run)?;
            let rv = store.resource_version().to_string();
            let list = json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": {"resourceVersion": rv}, "items": deleted});
            Ok(value_response(200, &list))
        }
        (Some(name), Method::GET) => {
            let object = store.get(&def, &key(name)).ok_or_else(|| ApiError::not_found(&def, name))?;
            if shared.faults.garbage() {
                return Ok(garbage_response(&def));
            }
            if metadata_only {
                return Ok(value_response(200, &partial_metadata(&object)));
            }
            Ok(json_response(200, object.json.clone()))
        }
        (Some(name), Method::PUT) => {
            let body = read_json(req, limit, &content_type).await?;
            Ok(value_response(200, &store.replace(&def, &key(name), body, target, dry_run)?))
        }
        (Some(name), Method::PATCH) => {
            let body = read_body(req, limit).await?;
            patch_object(shared, &def, &key(name), target, &content_type, &body, params, dry_run)
        }
        (Some(name), Method::DELETE) if target == Target::Main => {
            let body = read_body(req, limit).await?;
            let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
                Value::Null
            } else {
                serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
            };
            let dry_run = dry_run || options["dryRun"].as_array().is_some_and(|d| d.iter().any(|v| v == "All"));
            let pre = Preconditions {
                uid: options["preconditions"]["uid"].as_str().map(str::to_owned),
                resource_version: options["preconditions"]["resourceVersion"].as_str().map(str::to_owned),
            };
            Ok(value_response(200, &store.delete(&def, &key(name), &pre, dry_run)?))
        }
        (_, method) => Err(ApiError::method_not_allowed(&method)),
    }
}

fn list_query(def: &ResourceDef, params: &Params) -> Result<ListQuery, ApiError> {
    Ok(ListQuery {
        labels: params.labels()?,
        fields: params.fields(def)?,
        limit: params.number("limit")?.filter(|l| *l > 0).and_then(|l| usize::try_from(l).ok()),
        continue_token: params.get("continue").filter(|c| !c.is_empty()).map(str::to_owned),
        resource_version: params.get("resourceVersion").map(str::to_owned),
        resource_version_match: params.get("resourceVersionMatch").map(str::to_owned),
    })
}

/// The `PartialObjectMetadata` of an object (what metadata-only requests get).
pub(crate) fn partial_metadata(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
}

/// `{"kind":"PodList","apiVersion":"v1","metadata":{…},"items":[…]}`, written item by item
/// from the stored encodings (or as `PartialObjectMetadataList`).
fn list_body(def: &ResourceDef, page: &ListPage, metadata_only: bool) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let (Some(token), Some(map)) = (&page.continue_token, meta.as_object_mut()) {
        map.insert("continue".into(), token.clone().into());
    }
    let (kind, api_version) = if metadata_only {
        ("PartialObjectMetadataList".to_owned(), "meta.k8s.io/v1".to_owned())
    } else {
        (format!("{}List", def.kind), def.api_version())
    };
    let head = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
    let mut out = Vec::with_capacity(64 + page.items.len() * 512);
    let head = serde_json::to_vec(&head).unwrap_or_default();
    // `head` is an object: drop its closing brace and append the items.
    out.extend_from_slice(head.strip_suffix(b"}").unwrap_or(&head));
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if metadata_only {
            if serde_json::to_writer(&mut out, &partial_metadata(item)).is_err() {
                out.extend_from_slice(b"null");
            }
        } else {
            out.extend_from_slice(&item.json);
        }
    }
    out.extend_from_slice(b"]}");
    out
}

fn start_watch(
    shared: &Arc<Shared>,
    def: Arc<ResourceDef>,
    namespace: Option<&str>,
    name: Option<&str>,
    params: &Params,
    metadata_only: bool,
) -> Result<Response<Body>, ApiError> {
    let mut fields = params.get("fieldSelector").unwrap_or_default().to_owned();
    if let Some(name) = name {
        fields = format!("{fields},metadata.name={name}");
    }
    let query = WatchQuery {
        labels: params.labels()?,
        fields: FieldSelector::parse(&fields, &def).map_err(|e| ApiError::bad_request(e.to_string()))?,
        resource_version: params.get("resourceVersion").map(str::to_owned),
        send_initial_events: params.flag("sendInitialEvents")?,
        bookmarks: params.flag("allowWatchBookmarks")?,
    };
    let timeout = params.number("timeoutSeconds")?.filter(|t| *t > 0).map(|t| Duration::from_secs(t.unsigned_abs()));
    let filter = WatchFilter {
        def: def.clone(),
        namespace: namespace.map(str::to_owned),
        labels: query.labels.clone(),
        fields: query.fields.clone(),
    };
    let start = shared.store.start_watch(filter, &query)?;
    let stream = watch_stream(start, def, timeout, metadata_only, shared.faults.clone());
    let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(JSON));
    Ok(response)
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(err) => Err(ApiError::bad_request(format!("failed to read the request body: {err}"))),
    }
}

/// Parses a body as JSON (or YAML, which apply patches and `kubectl` may send).
fn parse_document(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(_) if content_type.contains("yaml") => {
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::from_slice_with_options(body, options).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
        }
        Err(err) => Err(ApiError::bad_request(format!("couldn't decode the request body as JSON: {err}"))),
    }
}

async fn read_json(req: Request<Incoming>, limit: usize, content_type: &str) -> Result<Value, ApiError> {
    let body = read_body(req, limit).await?;
    parse_document(&body, content_type)
}

#[allow(clippy::too_many_arguments)]
fn patch_object(
    shared: &Arc<Shared>,
    def: &ResourceDef,
    key: &ObjKey,
    target: Target,
    content_type: &str,
    body: &[u8],
    params: &Params,
    dry_run: bool,
) -> Result<Response<Body>, ApiError> {
    let store = &shared.store;
    match content_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let patch = parse_document(body, content_type)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            let patched = store.patch(def, key, target, dry_run, |old| {
                let mut new = old.clone();
                patch::merge_patch(&mut new, &patch);
                Ok(new)
            })?;
            Ok(value_response(200, &patched))
        }
        "application/json-patch+json" => {
            let ops = parse_document(body, content_type)?;
            let patched = store.patch(def, key, target, dry_run, |old| {
                patch::json_patch(old, &ops).map_err(|err| match err {
                    patch::JsonPatchError::NotAnArray | patch::JsonPatchError::BadOperation { .. } => {
                        ApiError::bad_request(err.to_string())
                    }
                    _ => ApiError::invalid(def, &key.1, err.to_string()),
                })
            })?;
            Ok(value_response(200, &patched))
        }
        "application/apply-patch+yaml" | "application/apply-patch+json" => {
            let applied = parse_document(body, "yaml")?;
            let manager = params
                .get("fieldManager")
                .filter(|m| !m.is_empty())
                .ok_or_else(|| ApiError::bad_request("PATCH requests of type application/apply-patch+yaml must specify fieldManager"))?;
            let request = ApplyRequest { manager, force: params.flag("force")?, target, dry_run };
            let (object, created) = store.apply(def, key, applied, &request)?;
            Ok(value_response(if created { 201 } else { 200 }, &object))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params() {
        let params = Params::parse("labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29&watch=1&limit=500&dryRun=All");
        assert_eq!(params.get("labelSelector"), Some("app=web,tier in (a,b)"));
        assert!(params.flag("watch").unwrap());
        assert_eq!(params.number("limit").unwrap(), Some(500));
        assert!(params.dry_run().unwrap());
        assert!(Params::parse("watch=maybe").flag("watch").is_err());
    }

    #[test]
    fn list_bodies_are_json() {
        let def = ResourceDef::new("apps", "v1", "DaemonSet", "daemonsets", true);
        let page = ListPage {
            items: vec![crate::store::Stored::new(json!({"kind": "DaemonSet", "metadata": {"name": "a"}}))],
            resource_version: 9,
            continue_token: Some("9.61.62".into()),
        };
        let parsed: Value = serde_json::from_slice(&list_body(&def, &page, false)).unwrap();
        assert_eq!(parsed["kind"], "DaemonSetList");
        assert_eq!(parsed["apiVersion"], "apps/v1");
        assert_eq!(parsed["metadata"]["continue"], "9.61.62");
        assert_eq!(parsed["items"][0]["metadata"]["name"], "a");
        let partial: Value = serde_json::from_slice(&list_body(&def, &page, true)).unwrap();
        assert_eq!(partial["kind"], "PartialObjectMetadataList");
        assert_eq!(
            partial["items"][0],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}})
        );
    }
}
