//! whatif's second input: the flows flock-agent saw, as it logs them — its JSON log lines of
//! target `flock::denied` (packets denied, audit-mode would-be denials, packets of revoked
//! connections, and new connections logged as allowed in namespaces annotated
//! `flock.dev/log-allowed`) — and which of those the change would flip.
//!
//! [`parse`] reads the lines (the `tracing` JSON format, fields nested under `fields` or
//! flattened), keeps one flow per (from, to, protocol, port) with how often and how it was
//! seen, and counts what it leaves out by why: other log lines, lines it cannot attribute to
//! flock-agent, records that are no policy verdict (spoofed source, unknown pod, another
//! table's drops), flows without a port (ICMP), unreadable lines. [`flips`] explains each flow
//! on the cluster before and after the change (in the family logged) and keeps those whose
//! verdict differs. Pure.
//!
//! Only a line that is flock-agent's is read: a bare JSON object, or kubectl's `--prefix` form
//! with flock-agent's container (`[pod/NAME/flock-agent] {…}`), either with `--timestamps`'
//! time before the object. A JSON object after any other text is not: a mixed stream
//! (`--all-containers`, another pod's logs, a text-format line quoting a pod's input) would
//! otherwise let whoever writes a line forge a flow the operator then reads as flock's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::whatif::{decided, verdict};
use super::{End, Explainer, Query};
use crate::model::{Family, Protocol, Snapshot};
use crate::translate::Options;

/// The log target of the records.
const TARGET: &str = "flock::denied";
/// Unreadable lines named in the answer (the rest are counted).
const NAMED: usize = 20;
/// flock-agent's container in its DaemonSet (`deploy/agent/daemonset.yaml`).
const CONTAINER: &str = "flock-agent";

/// One flow the agent logged, with how it was seen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    pub from: String,
    pub to: String,
    pub protocol: Protocol,
    pub port: u16,
    /// As logged (`None` from an agent that did not log it: each family both ends have).
    pub family: Option<Family>,
}

/// How a logged flow was seen: what the agent did with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// Records of denied packets (revoked connections included).
    pub denied: usize,
    /// Records of would-be denials in audit mode (accepted).
    pub audit: usize,
    /// New connections logged as allowed.
    pub allowed: usize,
}

/// What [`parse`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowLog {
    pub flows: BTreeMap<Flow, Seen>,
    /// Records read (before flows were merged).
    pub records: usize,
    /// Lines that are not `flock::denied` records (other logs, text format).
    pub other_lines: usize,
    /// Lines with a JSON object after text that is not kubectl's prefix of flock-agent's
    /// container (another container's, or anything else): not read.
    pub unattributed: usize,
    /// Records that are no policy verdict (spoofed source, unknown pod).
    pub not_policy: usize,
    /// Records without a port flock's policies can name (ICMP, other protocols).
    pub portless: usize,
    /// `flock::denied` records that cannot be read, the first few named (`line N: why`).
    pub unreadable: Vec<String>,
    pub unreadable_count: usize,
}

/// Reads flock-agent's JSON log lines.
pub fn parse(text: &str) -> FlowLog {
    let mut out = FlowLog::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line = match agent_record(line) {
            Attributed::Agent(json) => json,
            Attributed::Other => {
                out.other_lines += 1;
                continue;
            }
            Attributed::Foreign => {
                out.unattributed += 1;
                continue;
            }
        };
        let Ok(Value::Object(record)) = serde_json::from_str::<Value>(line) else {
            out.other_lines += 1;
            continue;
        };
        if record.get("target").and_then(Value::as_str) != Some(TARGET) {
            out.other_lines += 1;
            continue;
        }
        // `fields` nested (tracing's default) or flattened into the record.
        let fields = match record.get("fields") {
            Some(Value::Object(f)) => f,
            _ => &record,
        };
        match read_record(fields) {
            Ok(Some((flow, how))) => {
                out.records += 1;
                let seen = out.flows.entry(flow).or_default();
                match how {
                    How::Denied => seen.denied += 1,
                    How::Audit => seen.audit += 1,
                    How::Allowed => seen.allowed += 1,
                }
            }
            Ok(None) => {}
            Err(Skip::NotPolicy) => out.not_policy += 1,
            Err(Skip::Portless) => out.portless += 1,
            Err(Skip::Bad(why)) => {
                out.unreadable_count += 1;
                if out.unreadable.len() < NAMED {
                    out.unreadable.push(format!("line {}: {why}", i + 1));
                }
            }
        }
    }
    out
}

/// Whose a line is.
enum Attributed<'a> {
    /// flock-agent's, with the text where its JSON starts.
    Agent(&'a str),
    /// A line with no JSON object (a text-format log line, a blank or garbled one).
    Other,
    /// A JSON object after text that is not flock-agent's prefix.
    Foreign,
}

/// The JSON of a line of flock-agent's: the line itself, or what follows kubectl's
/// `[pod/NAME/flock-agent] ` (`--prefix`); either may start with an RFC 3339 time
/// (`--timestamps`).
fn agent_record(line: &str) -> Attributed<'_> {
    let line = line.trim();
    if !line.contains('{') {
        return Attributed::Other;
    }
    let mut rest = line;
    if let Some(after) = rest.strip_prefix("[pod/") {
        let Some((pod, after)) = after.split_once('/') else { return Attributed::Foreign };
        let Some(after) = after.strip_prefix(CONTAINER).and_then(|a| a.strip_prefix("] ")) else { return Attributed::Foreign };
        if pod.is_empty() || !pod.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.') {
            return Attributed::Foreign;
        }
        rest = after;
    }
    if let Some((time, after)) = rest.split_once(' ')
        && is_timestamp(time)
    {
        rest = after;
    }
    if rest.starts_with('{') { Attributed::Agent(rest) } else { Attributed::Foreign }
}

/// Whether `s` is a time as `kubectl logs --timestamps` writes it (`2026-11-27T10:00:00.123456789Z`).
fn is_timestamp(s: &str) -> bool {
    s.len() >= 20
        && s.as_bytes()[0].is_ascii_digit()
        && s.contains('T')
        && s.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b':' | b'.' | b'T' | b'Z' | b'+'))
}

enum How {
    Denied,
    Audit,
    Allowed,
}

enum Skip {
    NotPolicy,
    Portless,
    Bad(String),
}

fn read_record(f: &serde_json::Map<String, Value>) -> Result<Option<(Flow, How)>, Skip> {
    let text = |k: &str| f.get(k).and_then(Value::as_str).ok_or_else(|| Skip::Bad(format!("no {k:?} string")));
    let audit = f.get("audit").and_then(Value::as_bool).unwrap_or(false);
    // Another table's drop logged to the group: no verdict of flock's.
    if f.get("prefix").and_then(Value::as_str).is_some_and(|p| !p.is_empty()) {
        return Err(Skip::NotPolicy);
    }
    let how = match text("reason")? {
        "policy" if audit => How::Audit,
        "policy" | "revoked" => How::Denied,
        "allowed" => How::Allowed,
        "spoofed-source" | "unknown-pod" => return Err(Skip::NotPolicy),
        other => return Err(Skip::Bad(format!("unknown reason {other:?}"))),
    };
    let protocol = text("protocol")?;
    let Some(protocol) = Protocol::parse(protocol) else { return Err(Skip::Portless) };
    let port = match f.get("port").and_then(Value::as_u64) {
        Some(0) => return Err(Skip::Portless),
        Some(p) => u16::try_from(p).map_err(|_| Skip::Bad(format!("port {p} out of range")))?,
        None => return Err(Skip::Bad("no \"port\" number".into())),
    };
    let family = match f.get("family").and_then(Value::as_str) {
        None | Some("") => None,
        Some("IPv4") => Some(Family::V4),
        Some("IPv6") => Some(Family::V6),
        Some(other) => return Err(Skip::Bad(format!("unknown family {other:?}"))),
    };
    let (from, to) = (text("from")?, text("to")?);
    for end in [from, to] {
        End::parse(end).map_err(|e| Skip::Bad(e.to_string()))?;
    }
    Ok(Some((Flow { from: from.into(), to: to.into(), protocol, port, family }, how)))
}

/// One observed flow the change flips.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Flip {
    pub from: String,
    pub to: String,
    pub port: u16,
    pub protocol: &'static str,
    pub family: &'static str,
    pub before: &'static str,
    pub after: &'static str,
    /// Records of it: denied, audit, allowed.
    pub seen_denied: usize,
    pub seen_audit: usize,
    pub seen_allowed: usize,
    pub decided_before: Vec<String>,
    pub decided_after: Vec<String>,
}

/// Which observed flows the change flips.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flips {
    pub flips: Vec<Flip>,
    /// Distinct flows judged.
    pub flows: usize,
    pub records: usize,
    /// Flows that cannot be judged before or after (a pod no longer there, no address in
    /// common), each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unjudged: Vec<String>,
}

/// The observed flows of `log` whose verdict differs between `before` and `after`.
pub fn flips(before: &Snapshot, after: &Snapshot, options: &Options, log: &FlowLog) -> Flips {
    let mut explain_before = Explainer::new(before, options.clone());
    let mut explain_after = Explainer::new(after, options.clone());
    let mut out = Flips { flips: Vec::new(), flows: log.flows.len(), records: log.records, unjudged: Vec::new() };
    for (flow, seen) in &log.flows {
        let (Ok(from), Ok(to)) = (End::parse(&flow.from), End::parse(&flow.to)) else { continue };
        // The family as logged; an older agent's pod-to-pod record does not say it: each one
        // both pods have. An address end fixes the family.
        let families: &[Option<Family>] = match (&from, &to, flow.family) {
            (End::Pod(_), End::Pod(_), Some(Family::V4)) => &[Some(Family::V4)],
            (End::Pod(_), End::Pod(_), Some(Family::V6)) => &[Some(Family::V6)],
            (End::Pod(_), End::Pod(_), None) => &[Some(Family::V4), Some(Family::V6)],
            _ => &[None],
        };
        let mut judged = false;
        let mut why = None;
        for family in families {
            let query = Query { from: from.clone(), to: to.clone(), protocol: flow.protocol, port: flow.port, family: *family };
            let (b, a) = match (explain_before.explain(&query), explain_after.explain(&query)) {
                (Ok(b), Ok(a)) => (b, a),
                (Err(e), _) | (_, Err(e)) => {
                    why.get_or_insert(e.to_string());
                    continue;
                }
            };
            judged = true;
            if b.verdict != a.verdict {
                out.flips.push(Flip {
                    from: flow.from.clone(),
                    to: flow.to.clone(),
                    port: flow.port,
                    protocol: flow.protocol.as_k8s(),
                    family: b.family,
                    before: verdict(b.verdict),
                    after: verdict(a.verdict),
                    seen_denied: seen.denied,
                    seen_audit: seen.audit,
                    seen_allowed: seen.allowed,
                    decided_before: decided(&b),
                    decided_after: decided(&a),
                });
            }
        }
        if !judged {
            out.unjudged.push(format!(
                "{} → {} {}/{}: {}",
                flow.from,
                flow.to,
                flow.port,
                flow.protocol,
                why.unwrap_or_else(|| "cannot be explained".into())
            ));
        }
    }
    out.flips.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    fn line(reason: &str, from: &str, to: &str, protocol: &str, port: u16) -> String {
        serde_json::json!({
            "timestamp": "2026-11-27T10:00:00Z", "level": "INFO", "target": TARGET,
            "fields": {"message": "packet denied", "audit": false, "reason": reason, "direction": "ingress",
                       "pod": to, "from": from, "to": to, "protocol": protocol, "port": port, "policies": ""}
        })
        .to_string()
    }

    #[test]
    fn records_are_read_merged_and_what_is_left_out_is_counted() {
        let mut text = [
            line("policy", "x/a", "y/b", "TCP", 80),
            line("policy", "x/a", "y/b", "TCP", 80),
            line("allowed", "x/b", "y/b", "TCP", 80),
            line("spoofed-source", "198.18.0.9", "y/b", "TCP", 80),
            line("policy", "x/a", "y/b", "ICMP", 0),
            line("policy", "x/a", "not a pod or address", "TCP", 80),
            r#"{"timestamp":"t","level":"INFO","target":"flock::sync","fields":{"message":"synced"}}"#.to_string(),
            "2026-11-27T10:00:00Z  INFO flock::denied: packet denied".to_string(),
        ]
        .join("\n");
        // Flattened fields, an audit record.
        text.push('\n');
        text.push_str(
            &serde_json::json!({"target": TARGET, "reason": "policy", "audit": true, "from": "198.18.0.7", "to": "x/a", "protocol": "UDP", "port": 53})
                .to_string(),
        );
        let log = parse(&text);
        assert_eq!((log.records, log.flows.len(), log.other_lines, log.not_policy, log.portless, log.unreadable_count), (4, 3, 2, 1, 1, 1));
        assert!(log.unreadable[0].starts_with("line 6: "), "{:?}", log.unreadable);
        let seen = log.flows[&Flow { from: "x/a".into(), to: "y/b".into(), protocol: Protocol::Tcp, port: 80, family: None }];
        assert_eq!((seen.denied, seen.allowed, seen.audit), (2, 0, 0));
        let audit = log.flows[&Flow { from: "198.18.0.7".into(), to: "x/a".into(), protocol: Protocol::Udp, port: 53, family: None }];
        assert_eq!(audit.audit, 1);
    }

    /// Only flock-agent's lines are read: bare, or after kubectl's prefix of its container (and
    /// `--timestamps`); a record after any other text — another container's, a text-format
    /// line that quotes a pod's input — is counted and left out.
    #[test]
    fn only_lines_of_flock_agent_are_read() {
        let rec = line("allowed", "x/a", "y/b", "TCP", 80);
        let forged = line("allowed", "z/evil", "y/b", "TCP", 443);
        let text = [
            rec.clone(),
            format!("[pod/flock-agent-7xk2p/flock-agent] {rec}"),
            format!("2026-11-27T10:00:00.123456789Z {rec}"),
            format!("[pod/flock-agent-7xk2p/flock-agent] 2026-11-27T10:00:00.123456789Z {rec}"),
            // Another container of a pod, another pod's line, text before the JSON.
            format!("[pod/flock-agent-7xk2p/install-cni] {forged}"),
            format!("[pod/evil/app] {forged}"),
            format!("[pod/flock-agent-x/flock-agent]{forged}"),
            format!("[pod/Evil Pod/flock-agent] {forged}"),
            format!("2026-11-27T10:00:00Z  WARN flock::dns: refused answer for name {forged}"),
            format!("garbage {forged}"),
            format!("\x1b[2K {forged}"),
            "2026-11-27T10:00:00Z  INFO flock::sync: synced".to_string(),
        ]
        .join("\n");
        let log = parse(&text);
        assert_eq!((log.records, log.unattributed, log.other_lines), (4, 7, 1), "{log:?}");
        assert_eq!(log.flows.len(), 1, "a forged flow was read: {:?}", log.flows);
        assert!(log.flows.keys().all(|f| f.from == "x/a" && f.port == 80));
    }

    /// Every flip is what two explains say, and every observed flow whose explains differ
    /// is a flip.
    #[test]
    fn flips_are_the_observed_flows_whose_verdict_changes() {
        let before = testkit::base_cluster();
        let after = testkit::base_cluster_with(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: y}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n",
        );
        let pods = testkit::BASE_PODS;
        let mut text = String::new();
        for from in pods {
            for to in pods {
                if from != to {
                    text += &line("allowed", from, to, "TCP", 80);
                    text.push('\n');
                }
            }
        }
        text += &line("policy", "x/a", "x/gone", "TCP", 80);
        let log = parse(&text);
        let f = flips(&before, &after, &Options::default(), &log);
        assert_eq!(f.flows, pods.len() * (pods.len() - 1) + 1);
        assert_eq!(f.unjudged.len(), 1, "{:?}", f.unjudged);
        assert!(f.unjudged[0].starts_with("x/a → x/gone 80/TCP: pod x/gone"), "{:?}", f.unjudged);
        let mut expected = 0;
        for from in pods {
            for to in pods.iter().filter(|t| **t != from) {
                let q = Query {
                    from: End::parse(from).unwrap(),
                    to: End::parse(to).unwrap(),
                    protocol: Protocol::Tcp,
                    port: 80,
                    family: Some(Family::V4),
                };
                let (b, a) = (super::super::explain(&before, &q).unwrap(), super::super::explain(&after, &q).unwrap());
                let flipped = f.flips.iter().any(|x| x.from == *from && x.to == **to);
                assert_eq!(flipped, b.verdict != a.verdict, "{from} → {to}");
                expected += usize::from(b.verdict != a.verdict);
            }
        }
        assert!(expected > 0 && f.flips.len() == expected, "{} flips, {expected} expected", f.flips.len());
        assert!(f.flips.iter().all(|x| x.to.starts_with("y/") && x.after == "Deny" && x.seen_allowed == 1));
    }
}
