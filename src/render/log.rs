//! Kernel logging of what the ruleset denies (NFLOG): the log rule the renderer writes and
//! the prefix grammar the agent reads back (`agent::denials`).
//!
//! Every denial of a pod direction goes through one chain of that pod and direction, which
//! logs to an NFLOG group (rate-limited: `limit` before `log`, so over the rate the packet is
//! still dropped, only not logged) and drops. The prefix says what was denied, in a form
//! that needs no lookup in the kernel's state: `flock:deny:ingress:<interface>` (the pod's
//! host interface, which the agent maps back to its endpoint), `flock:spoofed`,
//! `flock:unknown-pod`, `flock:revoked`.

use std::fmt;

use super::rule::{Rule, Stmt};
use crate::translate::Direction;

/// How denials are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyLog {
    /// The NFLOG group the agent reads.
    pub group: u16,
    /// Records per second per pod and direction (and per kind of shared denial), after the
    /// burst.
    pub rate: u32,
    /// Records allowed at once before the rate applies.
    pub burst: u32,
}

impl DenyLog {
    pub(crate) const DEFAULT: Self = Self { group: 100, rate: 10, burst: 20 };

    /// What a logging chain does, for its comment: logs, `then` (`dropped`, `accepted`).
    pub(crate) fn describe(&self, then: &str) -> String {
        format!("logged (NFLOG group {}, {}/s, burst {}), {then}", self.group, self.rate, self.burst)
    }

    /// A chain logging with `prefix` (rate-limited), then giving `then` (a verdict, after a
    /// statement such as a reset).
    pub(crate) fn chain(&self, name: String, comment: String, prefix: &LogPrefix, then: Vec<Rule>) -> super::Chain {
        let mut rules = vec![self.rule(prefix)];
        rules.extend(then);
        super::Chain { name, comment, hook: None, rules: rules.into() }
    }

    /// The rule logging with `prefix` (rate-limited: over the rate the packet goes on, only
    /// not logged).
    pub(crate) fn rule(&self, prefix: &LogPrefix) -> Rule {
        Rule::new(
            vec![Stmt::Limit { rate: self.rate, burst: self.burst }, Stmt::Log { prefix: Some(prefix.to_string()), group: self.group }],
            None,
        )
    }
}

impl Default for DenyLog {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a log record is about: its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogPrefix {
    /// A pod's policy denied it, in `direction`; `interface` is the pod's host interface.
    Deny { direction: Direction, interface: String },
    /// A pod's policy allowed a new connection, in `direction` (its namespace asks for it:
    /// `flock.dev/log-allowed`).
    Allow { direction: Direction, interface: String },
    /// A pod's policies with the audited ones would deny it (it was accepted, unless the
    /// enforced policy denies it too).
    Audit { direction: Direction, interface: String },
    /// A packet from a pod interface with a source address that is not the pod's (or from
    /// an interface flock has no pod for).
    Spoofed,
    /// A packet to a pod interface flock has no policy for yet.
    UnknownPod,
    /// A packet of a connection a policy change revoked (`crate::revoke`): dropped, a TCP
    /// one answered with a reset.
    Revoked,
}

/// The first part of every prefix flock writes.
pub(crate) const PREFIX: &str = "flock:";

impl fmt::Display for LogPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deny { direction, interface } => write!(f, "{PREFIX}deny:{direction}:{}", super::names::comment(interface)),
            Self::Audit { direction, interface } => write!(f, "{PREFIX}audit:{direction}:{}", super::names::comment(interface)),
            Self::Allow { direction, interface } => write!(f, "{PREFIX}allow:{direction}:{}", super::names::comment(interface)),
            Self::Spoofed => write!(f, "{PREFIX}spoofed"),
            Self::UnknownPod => write!(f, "{PREFIX}unknown-pod"),
            Self::Revoked => write!(f, "{PREFIX}revoked"),
        }
    }
}

impl LogPrefix {
    /// Reads a prefix flock wrote; `None` for anything else.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(PREFIX)?;
        match rest {
            "spoofed" => return Some(Self::Spoofed),
            "unknown-pod" => return Some(Self::UnknownPod),
            "revoked" => return Some(Self::Revoked),
            _ => {}
        }
        let (kind, rest) = rest.split_once(':')?;
        let (dir, interface) = rest.split_once(':')?;
        let direction = match dir {
            "ingress" => Direction::Ingress,
            "egress" => Direction::Egress,
            _ => return None,
        };
        if interface.is_empty() {
            return None;
        }
        let interface = interface.to_string();
        match kind {
            "deny" => Some(Self::Deny { direction, interface }),
            "audit" => Some(Self::Audit { direction, interface }),
            "allow" => Some(Self::Allow { direction, interface }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_read_back() {
        for p in [
            LogPrefix::Deny { direction: Direction::Ingress, interface: "flk53f5ab4becbb".into() },
            LogPrefix::Deny { direction: Direction::Egress, interface: "flk0".into() },
            LogPrefix::Audit { direction: Direction::Ingress, interface: "flk0".into() },
            LogPrefix::Allow { direction: Direction::Egress, interface: "flk0".into() },
            LogPrefix::Spoofed,
            LogPrefix::UnknownPod,
            LogPrefix::Revoked,
        ] {
            assert_eq!(LogPrefix::parse(&p.to_string()), Some(p.clone()), "{p}");
        }
        for bad in ["", "flock:", "flock:deny:ingress:", "flock:deny:sideways:flk0", "other:spoofed", "flock:permit:ingress:flk0"] {
            assert_eq!(LogPrefix::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_rule_is_written_as_nft_lists_it() {
        let p = LogPrefix::Spoofed;
        assert_eq!(DenyLog::DEFAULT.rule(&p).to_string(), "limit rate 10/second burst 20 packets log prefix \"flock:spoofed\" group 100");
        assert_eq!(
            DenyLog { group: 7, rate: 1, burst: 5 }.rule(&p).to_string(),
            "limit rate 1/second log prefix \"flock:spoofed\" group 7"
        );
    }
}
