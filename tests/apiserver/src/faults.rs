//! Fault switches and the request log.
//!
//! [`Faults`] holds what the test handle switches at runtime — every request unavailable
//! (503), malformed bodies, a delay before every response, and a queue of [`FailRule`]s that
//! make the next matching requests fail with a chosen code. The [`RequestLog`] records every
//! request with its outcome, as [`RequestRecord`]s.

use std::{
    collections::VecDeque,
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

/// Requests that fail with `code` before reaching the store: the next `times` requests
/// matching `method` (any when `None`), whose path contains `path_contains` (any when
/// `None`), and that are watches or not as `watch` says (either when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRule {
    /// HTTP method to match, or any.
    pub method: Option<http::Method>,
    /// Substring of the request path to match, or any.
    pub path_contains: Option<String>,
    /// Only watch requests (`true`), only other requests (`false`), or any.
    pub watch: Option<bool>,
    /// How many more requests fail.
    pub times: usize,
    /// The HTTP status code (the `Status` body carries the matching `reason`).
    pub code: u16,
}

impl FailRule {
    /// The next `times` requests fail with `code`.
    pub fn new(times: usize, code: u16) -> Self {
        Self { method: None, path_contains: None, watch: None, times, code }
    }

    /// Only requests with this method.
    #[must_use]
    pub fn method(mut self, method: http::Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Only requests whose path contains this.
    #[must_use]
    pub fn path_contains(mut self, fragment: impl Into<String>) -> Self {
        self.path_contains = Some(fragment.into());
        self
    }

    /// Only watch requests (`true`) or only requests that are not watches (`false`).
    #[must_use]
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    fn matches(&self, method: &http::Method, path: &str, watch: bool) -> bool {
        self.times > 0
            && self.method.as_ref().is_none_or(|m| m == method)
            && self.path_contains.as_deref().is_none_or(|f| path.contains(f))
            && self.watch.is_none_or(|w| w == watch)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fault switches.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    unavailable: AtomicBool,
    garbage: AtomicBool,
    slow: Mutex<Option<Duration>>,
    rules: Mutex<Vec<FailRule>>,
}

impl Faults {
    pub fn set_unavailable(&self, on: bool) {
        self.unavailable.store(on, Ordering::SeqCst);
    }

    pub fn unavailable(&self) -> bool {
        self.unavailable.load(Ordering::SeqCst)
    }

    pub fn set_garbage(&self, on: bool) {
        self.garbage.store(on, Ordering::SeqCst);
    }

    pub fn garbage(&self) -> bool {
        self.garbage.load(Ordering::SeqCst)
    }

    pub fn set_slow(&self, delay: Option<Duration>) {
        *lock(&self.slow) = delay;
    }

    pub fn slow(&self) -> Option<Duration> {
        *lock(&self.slow)
    }

    pub fn add_rule(&self, rule: FailRule) {
        lock(&self.rules).push(rule);
    }

    pub fn clear_rules(&self) {
        lock(&self.rules).clear();
    }

    /// The code the request must fail with, consuming one use of the first matching rule.
    pub fn take_failure(&self, method: &http::Method, path: &str, watch: bool) -> Option<u16> {
        let mut rules = lock(&self.rules);
        let rule = rules.iter_mut().find(|r| r.matches(method, path, watch))?;
        rule.times -= 1;
        let code = rule.code;
        rules.retain(|r| r.times > 0);
        Some(code)
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: http::Method,
    /// Path, without the query.
    pub path: String,
    /// Raw query string (percent-encoded), `""` when none.
    pub query: String,
    /// Status code answered (for watches: of the response head; the stream goes on).
    pub status: u16,
    /// Whether it was a watch.
    pub watch: bool,
    /// When it arrived.
    pub at: SystemTime,
    /// How long until the response head was ready (includes `slow` delays).
    pub elapsed: Duration,
}

/// The most recent requests (bounded).
#[derive(Debug)]
pub(crate) struct RequestLog {
    records: Mutex<VecDeque<RequestRecord>>,
    limit: usize,
}

impl RequestLog {
    pub fn new(limit: usize) -> Self {
        Self { records: Mutex::new(VecDeque::new()), limit: limit.max(1) }
    }

    pub fn push(&self, record: RequestRecord) {
        let mut records = lock(&self.records);
        if records.len() == self.limit {
            records.pop_front();
        }
        records.push_back(record);
    }

    pub fn snapshot(&self) -> Vec<RequestRecord> {
        lock(&self.records).iter().cloned().collect()
    }

    pub fn clear(&self) {
        lock(&self.records).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_count_down_and_match() {
        let faults = Faults::default();
        faults.add_rule(FailRule::new(1, 500).method(http::Method::PATCH).path_contains("/leases/"));
        faults.add_rule(FailRule::new(2, 429));
        let get = http::Method::GET;
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", false), Some(429));
        assert_eq!(faults.take_failure(&http::Method::PATCH, "/apis/coordination.k8s.io/v1/namespaces/a/leases/x", false), Some(500));
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", true), Some(429));
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", false), None);
        // Watches only, until cleared.
        faults.add_rule(FailRule::new(10, 500).watch(true));
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", false), None);
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", true), Some(500));
        faults.clear_rules();
        assert_eq!(faults.take_failure(&get, "/api/v1/pods", true), None);
    }
}
