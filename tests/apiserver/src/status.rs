//! HTTP-level failures and the `Status` bodies that carry them.
//!
//! Every error the server answers with is an [`ApiError`]: an HTTP code, a Kubernetes
//! `reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, …) and a message, rendered
//! as the `{"kind":"Status","apiVersion":"v1","status":"Failure",…}` object real API servers
//! send, so kube's client decodes it into `kube::Error::Api`.

use serde_json::{Value, json};

use crate::registry::ResourceDef;

/// A request that failed, as the `Status` the server answers with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    /// HTTP status code, also the `code` field.
    pub code: u16,
    /// Machine-readable `reason` (`StatusReason` in the Kubernetes API).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Optional `details` object (`name`, `group`, `kind`, `causes`).
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    fn with_details(mut self, def: &ResourceDef, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
        self
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        status
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 `NotFound` for a named object.
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", def.qualified())).with_details(def, name)
    }

    /// 404 `NotFound` for a path the server does not serve.
    pub fn no_route() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(method: &http::Method) -> Self {
        Self::new(405, "MethodNotAllowed", format!("the server does not allow this method on the requested resource: {method}"))
    }

    /// 409 `AlreadyExists`.
    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", def.qualified())).with_details(def, name)
    }

    /// 409 `Conflict` (optimistic concurrency, preconditions, apply conflicts).
    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {} \"{name}\": {why}", def.qualified()))
            .with_details(def, name)
    }

    /// 409 `Conflict` of a server-side apply, with one cause per conflicting field.
    pub fn apply_conflict(def: &ResourceDef, name: &str, message: String, causes: Vec<Value>) -> Self {
        let mut err = Self::new(409, "Conflict", message);
        err.details = Some(json!({"name": name, "group": def.group, "kind": def.plural, "causes": causes}));
        err
    }

    /// 410 `Expired`: a resourceVersion or continue token older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 413 `RequestEntityTooLarge`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("request body larger than {limit} bytes"))
    }

    /// 415 `UnsupportedMediaType`.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    /// 422 `Invalid`.
    pub fn invalid(def: &ResourceDef, name: &str, why: impl Into<String>) -> Self {
        let why = why.into();
        Self::new(422, "Invalid", format!("{} \"{name}\" is invalid: {why}", def.kind)).with_details(def, name)
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 503 `ServiceUnavailable` (the `unavailable` fault).
    pub fn unavailable() -> Self {
        Self::new(503, "ServiceUnavailable", "the server is currently unable to handle the request (injected fault)")
    }

    /// 504 `Timeout`: a list or watch from a resourceVersion the server has not reached (yet),
    /// as the real one answers once its wait for the cache to catch up runs out: the
    /// `ResourceVersionTooLarge` cause is what clients (client-go's reflector) key on to
    /// relist with a consistent read.
    pub fn too_large_resource_version(asked: u64, current: u64) -> Self {
        let mut err = Self::new(504, "Timeout", format!("Timeout: Too large resource version: {asked}, current: {current}"));
        err.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        err
    }

    /// An injected failure with an arbitrary code (the `fail_next` fault).
    pub fn injected(code: u16) -> Self {
        Self::new(code, reason_for(code), format!("injected failure ({code})"))
    }
}

/// The `reason` real API servers pair with an HTTP code.
fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_body_has_the_fields_kube_decodes() {
        let def = ResourceDef::new("", "v1", "Pod", "pods", true);
        let status = ApiError::not_found(&def, "web").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(status["message"], "pods \"web\" not found");
        assert_eq!(status["details"]["name"], "web");
        let def = ResourceDef::new("apps", "v1", "DaemonSet", "daemonsets", true);
        assert_eq!(ApiError::already_exists(&def, "a").message, "daemonsets.apps \"a\" already exists");
        assert_eq!(ApiError::injected(429).reason, "TooManyRequests");
        let too_large = ApiError::too_large_resource_version(9, 4).to_status();
        assert_eq!((too_large["code"].as_u64(), too_large["reason"].as_str()), (Some(504), Some("Timeout")));
        assert_eq!(too_large["message"], "Timeout: Too large resource version: 9, current: 4");
        assert_eq!(too_large["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
        assert_eq!(too_large["details"]["retryAfterSeconds"], 1);
    }
}
