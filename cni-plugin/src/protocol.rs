//! The contract between flock-cni and flock-agent (design.md §3), used by both sides.
//!
//! One JSON object per line over a unix socket (`/run/flock/cni.sock` by default, root only;
//! the conflist key `agentSocket` overrides it). Every request and reply carries the
//! protocol `version`; a side that sees another version refuses the message. One request
//! per connection: the plugin connects, writes a line, reads a line.
//!
//! `add` is acknowledged only after the pod's rules are committed; `del` removes the
//! endpoint; `check` asks whether the endpoint is programmed; `status` whether the agent is
//! ready; `gc` drops endpoints not in the valid list. DELs that cannot reach the agent are
//! written to the spool directory (`/run/flock/pending-del/`) for the agent to drain at
//! start.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::attachment_file;
use crate::spec::Attachment;

/// Version of this protocol.
pub const PROTOCOL_VERSION: u32 = 1;
/// The agent's socket.
pub const DEFAULT_SOCKET: &str = "/run/flock/cni.sock";
/// Where DELs wait while the agent is down.
pub const DEFAULT_PENDING_DEL_DIR: &str = "/run/flock/pending-del";
/// At most this many spooled DELs; beyond it DEL fails (and the runtime retries) rather
/// than filling the disk.
pub const MAX_PENDING_DELS: usize = 4096;
/// Upper bound of one request line, either way.
pub const MAX_LINE: usize = 1 << 20;

/// The pod an attachment belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// ADD: the pod's interface exists; acknowledge once its rules are committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddRequest {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub host_interface: String,
    pub pod: PodIdentity,
    /// The pod's addresses (no prefix).
    pub ips: Vec<std::net::IpAddr>,
}

/// DEL: the attachment is gone (or going).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelRequest {
    pub container_id: String,
    pub ifname: String,
    pub host_interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodIdentity>,
}

/// CHECK: is this endpoint programmed?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckRequest {
    pub container_id: String,
    pub ifname: String,
    pub host_interface: String,
}

/// GC: drop every endpoint not listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    pub valid: Vec<Attachment>,
}

/// A request, tagged by `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Add(AddRequest),
    Del(DelRequest),
    Check(CheckRequest),
    Status,
    Gc(GcRequest),
}

impl Request {
    pub fn op(&self) -> &'static str {
        match self {
            Self::Add(_) => "add",
            Self::Del(_) => "del",
            Self::Check(_) => "check",
            Self::Status => "status",
            Self::Gc(_) => "gc",
        }
    }
}

/// A request on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestEnvelope {
    pub version: u32,
    #[serde(flatten)]
    pub request: Request,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub version: u32,
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    pub fn ok() -> Self {
        Self { version: PROTOCOL_VERSION, ok: true, error: None }
    }

    pub fn refused(why: impl Into<String>) -> Self {
        Self { version: PROTOCOL_VERSION, ok: false, error: Some(why.into()) }
    }
}

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No connection: the agent never saw the request.
    #[error("cannot reach flock-agent at {socket}: {source}")]
    Unreachable {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The connection failed after it was made: the request may have arrived.
    #[error("the connection to flock-agent at {socket} failed during {op}: {source}")]
    Broken {
        socket: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("flock-agent at {socket} did not answer {op} within {timeout:?}")]
    Timeout { socket: PathBuf, op: &'static str, timeout: Duration },
    #[error("flock-agent at {socket} sent an invalid reply to {op}: {message}")]
    Protocol { socket: PathBuf, op: &'static str, message: String },
    #[error("flock-agent refused {op}: {message}")]
    Refused { op: &'static str, message: String },
}

impl AgentError {
    /// Whether the agent may have received, and acted on, the request: anything but a
    /// connection that was never made. (An agent that refused an ADD may still hold the
    /// endpoint: it registers it before waiting for the sync that failed.)
    pub fn may_have_reached_agent(&self) -> bool {
        !matches!(self, Self::Unreachable { .. })
    }
}

/// Sends `request` and waits at most `timeout` for the reply.
pub fn call(socket: &Path, request: Request, timeout: Duration) -> Result<(), AgentError> {
    let stream = UnixStream::connect(socket).map_err(|source| AgentError::Unreachable { socket: socket.to_path_buf(), source })?;
    exchange(socket, stream, request, timeout)
}

/// How often [`call_waiting`] tries to connect again.
const RECONNECT: Duration = Duration::from_millis(50);

/// [`call`], for an agent that may be restarting: while its socket is missing or refuses
/// connections (the old process gone, the new one not listening yet), connect again every
/// 50 ms; `timeout` bounds the whole call, waiting included. Any other failure is returned
/// at once.
pub fn call_waiting(socket: &Path, request: Request, timeout: Duration) -> Result<(), AgentError> {
    let deadline = Instant::now() + timeout;
    let mut waited = false;
    let stream = loop {
        match UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused)
                    && Instant::now() + RECONNECT < deadline =>
            {
                if !waited {
                    tracing::info!(socket = %socket.display(), error = %e, "flock-agent is not listening (restarting?): waiting for it");
                    waited = true;
                }
                std::thread::sleep(RECONNECT);
            }
            Err(source) => return Err(AgentError::Unreachable { socket: socket.to_path_buf(), source }),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    exchange(socket, stream, request, left)
}

/// One request and its reply on a connected `stream`.
fn exchange(socket: &Path, mut stream: UnixStream, request: Request, timeout: Duration) -> Result<(), AgentError> {
    let op = request.op();
    let unreachable = |source| AgentError::Unreachable { socket: socket.to_path_buf(), source };
    stream.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    stream.set_write_timeout(Some(timeout)).map_err(unreachable)?;
    let mut line = serde_json::to_vec(&RequestEnvelope { version: PROTOCOL_VERSION, request }).map_err(|e| AgentError::Protocol {
        socket: socket.to_path_buf(),
        op,
        message: e.to_string(),
    })?;
    line.push(b'\n');
    let broken = |source| AgentError::Broken { socket: socket.to_path_buf(), op, source };
    stream.write_all(&line).map_err(broken)?;
    let mut reader = BufReader::new(stream);
    let reply = match read_line(&mut reader) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Err(AgentError::Protocol { socket: socket.to_path_buf(), op, message: "connection closed without a reply".into() });
        }
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            return Err(AgentError::Timeout { socket: socket.to_path_buf(), op, timeout });
        }
        Err(e) => return Err(broken(e)),
    };
    let reply: Reply =
        serde_json::from_str(&reply).map_err(|e| AgentError::Protocol { socket: socket.to_path_buf(), op, message: e.to_string() })?;
    if reply.version != PROTOCOL_VERSION {
        return Err(AgentError::Protocol {
            socket: socket.to_path_buf(),
            op,
            message: format!("protocol version {} (flock-cni speaks {PROTOCOL_VERSION})", reply.version),
        });
    }
    if reply.ok { Ok(()) } else { Err(AgentError::Refused { op, message: reply.error.unwrap_or_default() }) }
}

/// Reads one line (without the newline), at most [`MAX_LINE`] bytes; `None` at EOF.
pub fn read_line<R: BufRead>(reader: &mut R) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = reader.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_LINE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    }
    String::from_utf8(buf).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Decodes a request line (the agent side), refusing other protocol versions.
pub fn decode_request(line: &str) -> Result<Request, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(ver) if ver == u64::from(PROTOCOL_VERSION) => {}
        Some(ver) => return Err(format!("protocol version {ver} (the agent speaks {PROTOCOL_VERSION})")),
        None => return Err("no protocol version".into()),
    }
    serde_json::from_value::<RequestEnvelope>(v).map(|e| e.request).map_err(|e| format!("invalid request: {e}"))
}

/// Encodes a reply line, with its newline.
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut v = serde_json::to_vec(reply).unwrap_or_else(|_| br#"{"version":1,"ok":false,"error":"unencodable reply"}"#.to_vec());
    v.push(b'\n');
    v
}

/// The spool file of a DEL: `<dir>/<hash of container id and ifname>.json`
/// ([`attachment_file`]).
pub fn spool_path(dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    dir.join(attachment_file::file_name(container_id, ifname))
}

/// The key a spool file holds.
fn spooled_key(bytes: &[u8]) -> Option<(String, String)> {
    match decode_request(std::str::from_utf8(bytes).ok()?).ok()? {
        Request::Del(d) => Some((d.container_id, d.ifname)),
        _ => None,
    }
}

/// Writes a DEL for the agent to replay (atomically: a temporary file, then rename). A
/// repeated DEL replaces its own file, never another attachment's.
pub fn spool_del(dir: &Path, del: &DelRequest) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    set_private(dir)?;
    let path = spool_path(dir, &del.container_id, &del.ifname);
    if !path.exists() {
        let queued =
            std::fs::read_dir(dir)?.filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json"))).count();
        if queued >= MAX_PENDING_DELS {
            return Err(std::io::Error::other(format!("{} DELs already wait in {}", queued, dir.display())));
        }
    }
    let body = serde_json::to_vec(&RequestEnvelope { version: PROTOCOL_VERSION, request: Request::Del(del.clone()) })?;
    attachment_file::write(dir, &del.container_id, &del.ifname, &body, spooled_key)
}

/// Reads every spooled DEL (the agent drains them at start), in file name order (DELs of
/// distinct attachments commute; a DEL is idempotent), with the path of each so it can be
/// removed once handled. Each DEL is taken from the file's content, so files of every naming
/// flock-cni has used are read. Unreadable files are returned as errors so they can be
/// reported and removed.
pub fn read_spool(dir: &Path) -> std::io::Result<Vec<(PathBuf, Result<DelRequest, String>)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut paths: Vec<PathBuf> =
        entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    paths.sort();
    for p in paths {
        let parsed = std::fs::read_to_string(&p).map_err(|e| e.to_string()).and_then(|t| match decode_request(&t)? {
            Request::Del(d) => Ok(d),
            other => Err(format!("a spooled {} request", other.op())),
        });
        out.push((p, parsed));
    }
    Ok(out)
}

fn set_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn add() -> Request {
        Request::Add(AddRequest {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/p".into(),
            host_interface: "flk0123456789ab".into(),
            pod: PodIdentity { namespace: "x".into(), name: "a".into(), uid: Some("u".into()) },
            ips: vec!["198.18.1.11".parse().unwrap()],
        })
    }

    #[test]
    fn wire_format_is_stable() {
        let line = serde_json::to_string(&RequestEnvelope { version: PROTOCOL_VERSION, request: add() }).unwrap();
        assert_eq!(
            line,
            r#"{"version":1,"op":"add","containerId":"c1","ifname":"eth0","netns":"/run/netns/p","hostInterface":"flk0123456789ab","pod":{"namespace":"x","name":"a","uid":"u"},"ips":["198.18.1.11"]}"#
        );
        assert_eq!(decode_request(&line).unwrap(), add());
        assert_eq!(
            serde_json::to_string(&RequestEnvelope { version: 1, request: Request::Status }).unwrap(),
            r#"{"version":1,"op":"status"}"#
        );
        assert!(decode_request(r#"{"version":2,"op":"status"}"#).unwrap_err().contains("version 2"));
        assert!(decode_request(r#"{"op":"status"}"#).is_err());
        assert!(decode_request(r#"{"version":1,"op":"reboot"}"#).is_err());
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flock-cni-proto-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn call_round_trip_refusal_and_timeout() {
        let dir = temp("call");
        let sock = dir.join("s.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            for (i, conn) in listener.incoming().take(3).enumerate() {
                let conn = conn.unwrap();
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let req = decode_request(&read_line(&mut r).unwrap().unwrap()).unwrap();
                let mut w = conn;
                match i {
                    0 => w.write_all(&encode_reply(&Reply::ok())).unwrap(),
                    1 => w.write_all(&encode_reply(&Reply::refused(format!("no pod for {}", req.op())))).unwrap(),
                    _ => std::thread::sleep(Duration::from_millis(400)),
                }
            }
        });
        call(&sock, add(), Duration::from_secs(2)).unwrap();
        let e = call(&sock, Request::Status, Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, AgentError::Refused { .. }) && e.to_string().contains("no pod for status"), "{e}");
        let e = call(&sock, Request::Status, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, AgentError::Timeout { .. }), "{e}");
        server.join().unwrap();
        let e = call(&dir.join("absent.sock"), Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, AgentError::Unreachable { .. }), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An agent restarting: its old socket left behind (connections refused), then a new one
    /// in its place. The ADD waits and goes through; with nobody ever listening it gives up
    /// at its timeout.
    #[test]
    fn call_waiting_waits_for_a_restarting_agent() {
        let dir = temp("waiting");
        let sock = dir.join("s.sock");
        drop(UnixListener::bind(&sock).unwrap());
        let path = sock.clone();
        let agent = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path).unwrap();
            let (conn, _) = listener.accept().unwrap();
            let mut r = BufReader::new(conn.try_clone().unwrap());
            decode_request(&read_line(&mut r).unwrap().unwrap()).unwrap();
            let mut w = conn;
            w.write_all(&encode_reply(&Reply::ok())).unwrap();
        });
        assert!(matches!(call(&sock, add(), Duration::from_secs(1)), Err(AgentError::Unreachable { .. })));
        let started = std::time::Instant::now();
        call_waiting(&sock, add(), Duration::from_secs(5)).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        agent.join().unwrap();
        let started = std::time::Instant::now();
        let e = call_waiting(&dir.join("absent.sock"), add(), Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, AgentError::Unreachable { .. }) && !e.may_have_reached_agent(), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn spool_round_trip() {
        let dir = temp("spool");
        let del = DelRequest { container_id: "c1".into(), ifname: "eth0".into(), host_interface: "flk0123456789ab".into(), pod: None };
        let p = spool_del(&dir.join("pending"), &del).unwrap();
        assert_eq!(p, spool_path(&dir.join("pending"), "c1", "eth0"));
        spool_del(&dir.join("pending"), &del).unwrap(); // a repeated DEL replaces its file
        std::fs::write(dir.join("pending/garbage.json"), "{").unwrap();
        let read = read_spool(&dir.join("pending")).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].1.as_ref().unwrap(), &del);
        assert!(read[1].1.is_err());
        assert!(read_spool(&dir.join("nothing")).unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn del(id: &str, ifname: &str) -> DelRequest {
        DelRequest { container_id: id.into(), ifname: ifname.into(), host_interface: crate::host_interface_name(id, ifname), pod: None }
    }

    fn spooled(dir: &Path) -> Vec<DelRequest> {
        let mut v: Vec<DelRequest> = read_spool(dir).unwrap().into_iter().map(|(_, d)| d.unwrap()).collect();
        v.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        v
    }

    #[test]
    fn dels_whose_old_names_collide_are_both_kept() {
        let dir = temp("spool-collide");
        let (x, y) = (del("a-b", "c"), del("a", "b-c"));
        spool_del(&dir, &x).unwrap();
        spool_del(&dir, &y).unwrap();
        assert_eq!(spooled(&dir), vec![y, x]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_container_id_of_1024_characters_is_spooled() {
        let dir = temp("spool-long");
        let d = del(&"c".repeat(1024), "eth0");
        let p = spool_del(&dir, &d).unwrap();
        assert!(p.file_name().unwrap().len() <= attachment_file::NAME_MAX);
        assert_eq!(spooled(&dir), vec![d]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn dels_spooled_under_the_old_name_are_still_read() {
        let dir = temp("spool-upgrade");
        // What flock-cni wrote before: <container id>-<ifname>.json.
        let old = del("c1", "eth0");
        let body = serde_json::to_vec(&RequestEnvelope { version: PROTOCOL_VERSION, request: Request::Del(old.clone()) }).unwrap();
        std::fs::write(dir.join("c1-eth0.json"), body).unwrap();
        assert_eq!(spooled(&dir), vec![old.clone()]);
        // A new DEL of another attachment is spooled next to it; nothing is lost.
        spool_del(&dir, &del("c2", "eth0")).unwrap();
        assert_eq!(spooled(&dir), vec![old, del("c2", "eth0")]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_a_connection_never_made_cannot_have_reached_the_agent() {
        let dir = temp("reach");
        let e = call(&dir.join("absent.sock"), Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(!e.may_have_reached_agent(), "{e}");
        let timeout = AgentError::Timeout { socket: dir.clone(), op: "add", timeout: Duration::from_secs(1) };
        assert!(timeout.may_have_reached_agent());
        assert!(AgentError::Refused { op: "add", message: "sync failed".into() }.may_have_reached_agent());
        // The agent took the line, then hung up without a reply.
        let sock = dir.join("s.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut r = BufReader::new(conn);
            read_line(&mut r).unwrap();
        });
        let e = call(&sock, add(), Duration::from_secs(2)).unwrap_err();
        assert!(e.may_have_reached_agent(), "{e}");
        server.join().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
