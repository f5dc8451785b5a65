//! The body of a watch response: a stream of JSON lines, one event each.
//!
//! It sends the initial messages of a [`WatchStart`] (synthetic ADDED events, replayed
//! history, or one ERROR), then the live feed until the store closes it (`drop_watches`,
//! `unavailable`, shutdown), `timeoutSeconds` passes, or the client goes away — dropping the
//! stream unregisters the watch. With the `garbage` fault on, a malformed line precedes every
//! line (events themselves still arrive).

use std::{collections::VecDeque, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::Stream;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    faults::Faults,
    http::partial_metadata,
    registry::ResourceDef,
    store::{WatchMsg, WatchStart},
};

/// What the `garbage` fault sends: a line that is not JSON (and not a truncated line, which
/// kube's decoder would silently skip).
pub(crate) const GARBAGE_LINE: &[u8] = b"{\"type\":\"MODIFIED\",\"object\":{\"kind\": <<garbage from flock-test-apiserver>>}}\n";

/// Renders one message as a line.
fn render(msg: &WatchMsg, def: &ResourceDef, metadata_only: bool) -> Vec<u8> {
    let mut line = Vec::with_capacity(256);
    let written = match msg {
        WatchMsg::Garbage => return GARBAGE_LINE.to_vec(),
        WatchMsg::Event(kind, object) if metadata_only => write_event(&mut line, kind.as_str(), &partial_metadata(object)),
        WatchMsg::Event(kind, object) => {
            write_head(&mut line, kind.as_str());
            line.extend_from_slice(&object.json);
            line.extend_from_slice(b"}\n");
            Ok(())
        }
        WatchMsg::Bookmark { rv, initial_events_end } => {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if *initial_events_end && let Some(map) = meta.as_object_mut() {
                map.insert("annotations".into(), json!({"k8s.io/initial-events-end": "true"}));
            }
            let object = json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": meta});
            write_event(&mut line, "BOOKMARK", &object)
        }
        WatchMsg::Error(err) => write_event(&mut line, "ERROR", &err.to_status()),
    };
    match written {
        Ok(()) => line,
        // Serialising a `Value` does not fail; if it did, the client sees a bad line.
        Err(_) => GARBAGE_LINE.to_vec(),
    }
}

fn write_head(line: &mut Vec<u8>, kind: &str) {
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
}

fn write_event(line: &mut Vec<u8>, kind: &str, object: &Value) -> serde_json::Result<()> {
    write_head(line, kind);
    serde_json::to_writer(&mut *line, object)?;
    line.extend_from_slice(b"}\n");
    Ok(())
}

struct State {
    initial: VecDeque<WatchMsg>,
    start: Option<WatchStart>,
    deadline: Option<Instant>,
    def: Arc<ResourceDef>,
    metadata_only: bool,
    faults: Arc<Faults>,
    done: bool,
}

/// The stream of body frames of a watch.
pub(crate) fn watch_stream(
    start: WatchStart,
    def: Arc<ResourceDef>,
    timeout: Option<Duration>,
    metadata_only: bool,
    faults: Arc<Faults>,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
    let mut start = start;
    let initial = std::mem::take(&mut start.initial).into();
    let state =
        State { initial, start: Some(start), deadline: timeout.map(|t| Instant::now() + t), def, metadata_only, faults, done: false };
    futures::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        let msg = match state.initial.pop_front() {
            Some(msg) => msg,
            None => {
                let (rx, _guard) = state.start.as_mut()?.live.as_mut()?;
                match state.deadline {
                    Some(deadline) => tokio::select! {
                        msg = rx.recv() => msg?,
                        () = tokio::time::sleep_until(deadline) => return None,
                    },
                    None => rx.recv().await?,
                }
            }
        };
        if matches!(msg, WatchMsg::Error(_)) {
            state.done = true;
        }
        let mut line = Vec::new();
        if state.faults.garbage() && !matches!(msg, WatchMsg::Garbage) {
            line.extend_from_slice(GARBAGE_LINE);
        }
        line.extend(render(&msg, &state.def, state.metadata_only));
        Some((Ok(Frame::data(Bytes::from(line))), state))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{status::ApiError, store::EventType};

    #[test]
    fn lines() {
        let def = ResourceDef::new("", "v1", "Pod", "pods", true);
        let obj = crate::store::Stored::new(json!({"kind": "Pod", "metadata": {"name": "p"}}));
        let line = render(&WatchMsg::Event(EventType::Added, obj), &def, false);
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed, json!({"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "p"}}}));
        let bookmark: Value =
            serde_json::from_slice(&render(&WatchMsg::Bookmark { rv: 7, initial_events_end: true }, &def, false)).unwrap();
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(bookmark["object"]["apiVersion"], "v1");
        assert_eq!(bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        let error: Value = serde_json::from_slice(&render(&WatchMsg::Error(ApiError::expired("old")), &def, false)).unwrap();
        assert_eq!(error["type"], "ERROR");
        assert_eq!(error["object"]["code"], 410);
        assert!(serde_json::from_slice::<Value>(GARBAGE_LINE).is_err_and(|e| !e.is_eof()));
    }
}
