//! The DNS proxy's learner ([`super::dns_proxy::Learner`]): which domain rules a pod's answer
//! feeds, and the addresses it teaches written into those rules' timed nft sets before the
//! pod sees the answer.
//!
//! A domain rule is what a policy's `domainNames` peer (or a run's `domains`) becomes on this
//! node: the addresses of the local pods it applies to, its name patterns, and its two timed
//! sets (one per family). The agent replaces the whole list after every committed sync
//! ([`DomainLearner::set_rules`]); an answer is matched by the name the pod asked for (the
//! CNAME chain's addresses belong to it, as the NPEP says), and every rule it matches for
//! that pod gets the addresses, in one netlink batch.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::dns_proxy::Learner;
use crate::apply::netlink::NfSocket;
use crate::apply::netlink::timed::TimedElement;
use crate::dns::{DomainPattern, Learned};

/// One domain rule on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRule {
    /// What it comes from, for logs: `policy <ns>/<name> egress[i]`.
    pub source: String,
    /// The addresses of the local pods it applies to.
    pub pods: BTreeSet<IpAddr>,
    pub patterns: Vec<DomainPattern>,
    /// Its timed sets in flock's table.
    pub set_v4: String,
    pub set_v6: String,
}

/// Writes learned elements into timed sets (the kernel's: [`NfSocket`]; a fake in tests).
pub trait TimedWriter: Send + 'static {
    fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)]) -> Result<(), String>;
}

/// Opens its socket on first use, in the namespace of the thread that writes first (the
/// agent's: the node's), and again after an error (a socket that failed may hold replies).
#[derive(Default)]
pub struct KernelWriter {
    socket: Option<NfSocket>,
}

impl TimedWriter for KernelWriter {
    fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)]) -> Result<(), String> {
        let socket = match self.socket.as_mut() {
            Some(s) => s,
            None => self.socket.insert(NfSocket::open().map_err(|e| e.to_string())?),
        };
        let written = socket.write_timed(sets);
        if written.is_err() {
            self.socket = None;
        }
        written.map_err(|e| e.to_string())
    }
}

/// The learner: the current domain rules and the writer.
pub struct DomainLearner<W> {
    rules: RwLock<Arc<Vec<DomainRule>>>,
    /// Counts the addresses each rule learned.
    metrics: Option<Arc<super::metrics::Metrics>>,
    // A std mutex held across one netlink batch: the kernel answers at once (no network), and
    // the answer waits for it anyway.
    writer: Mutex<W>,
}

impl<W: TimedWriter> DomainLearner<W> {
    pub fn new(writer: W) -> Self {
        Self { rules: RwLock::new(Arc::new(Vec::new())), metrics: None, writer: Mutex::new(writer) }
    }

    /// Counting what each rule learns in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<super::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Replaces the domain rules (after each committed sync).
    pub fn set_rules(&self, rules: Vec<DomainRule>) {
        let mut current = self.rules.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = Arc::new(rules);
    }

    fn rules(&self) -> Arc<Vec<DomainRule>> {
        self.rules.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The elements `learned` adds for the pod at `client`, per set (none when no rule of the
    /// pod matches the name).
    pub fn elements(&self, client: IpAddr, learned: &Learned) -> Vec<(String, Vec<TimedElement>)> {
        let comment = match learned.chain.last() {
            Some(last) => format!("{} (via {last})", learned.name),
            None => learned.name.clone(),
        };
        let mut out = Vec::new();
        for rule in self.rules().iter() {
            if !rule.pods.contains(&client) || !rule.patterns.iter().any(|p| p.matches(&learned.name)) {
                continue;
            }
            for (set, v4) in [(&rule.set_v4, true), (&rule.set_v6, false)] {
                let elements: Vec<TimedElement> = learned
                    .addresses
                    .iter()
                    .filter(|(a, _)| a.is_ipv4() == v4)
                    .map(|(addr, ttl)| TimedElement {
                        addr: *addr,
                        timeout: Duration::from_secs(u64::from(*ttl)),
                        comment: comment.clone(),
                    })
                    .collect();
                if !elements.is_empty() {
                    out.push((set.clone(), elements));
                }
            }
        }
        out
    }
}

impl<W: TimedWriter> Learner for DomainLearner<W> {
    async fn learn(&self, client: IpAddr, _resolver: SocketAddr, learned: &Learned) -> Result<(), String> {
        let elements = self.elements(client, learned);
        if elements.is_empty() {
            return Ok(());
        }
        let written = {
            let mut writer = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            writer.write_timed(&elements)
        };
        if let (Ok(()), Some(m)) = (&written, &self.metrics) {
            for rule in self.rules().iter().filter(|r| r.pods.contains(&client) && r.patterns.iter().any(|p| p.matches(&learned.name))) {
                m.dns_learned(&rule.source, learned.addresses.len() as u64);
            }
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        written: Vec<Vec<(String, Vec<TimedElement>)>>,
    }

    impl TimedWriter for Fake {
        fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)]) -> Result<(), String> {
            self.written.push(sets.to_vec());
            Ok(())
        }
    }

    fn rule(source: &str, pods: &[&str], patterns: &[&str]) -> DomainRule {
        DomainRule {
            source: source.into(),
            pods: pods.iter().map(|p| p.parse().unwrap()).collect(),
            patterns: patterns.iter().map(|p| DomainPattern::parse(p).unwrap()).collect(),
            set_v4: format!("{source}-v4"),
            set_v6: format!("{source}-v6"),
        }
    }

    fn learned(name: &str, chain: &[&str], addresses: &[(&str, u32)]) -> Learned {
        Learned {
            name: name.into(),
            chain: chain.iter().map(|c| c.to_string()).collect(),
            addresses: addresses.iter().map(|(a, t)| (a.parse().unwrap(), *t)).collect(),
            dropped: 0,
        }
    }

    #[tokio::test]
    async fn answers_feed_the_rules_of_the_asking_pod_that_match_the_asked_name() {
        let l = DomainLearner::new(Fake::default());
        l.set_rules(vec![
            rule("a", &["198.18.0.7"], &["*.pypi.org"]),
            rule("b", &["198.18.0.7", "2001:db8::7"], &["files.pypi.org", "github.com"]),
            rule("c", &["198.18.0.8"], &["*.pypi.org"]),
        ]);
        let client: IpAddr = "198.18.0.7".parse().unwrap();
        let resolver: SocketAddr = "198.18.0.53:53".parse().unwrap();
        let answer = learned("files.pypi.org", &["dualstack.x.example"], &[("198.18.5.1", 60), ("2001:db8:5::1", 30)]);
        l.learn(client, resolver, &answer).await.unwrap();
        let written = l.writer.lock().unwrap().written.clone();
        assert_eq!(written.len(), 1, "one batch per answer");
        let sets: Vec<&str> = written[0].iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(sets, vec!["a-v4", "a-v6", "b-v4", "b-v6"]);
        assert_eq!(written[0][0].1[0].timeout, Duration::from_secs(60));
        assert_eq!(written[0][1].1[0].timeout, Duration::from_secs(30));
        assert_eq!(written[0][0].1[0].comment, "files.pypi.org (via dualstack.x.example)");
        // A name no rule of the pod admits, and another pod's rule: nothing written.
        l.learn(client, resolver, &learned("pypi.org", &[], &[("198.18.5.2", 60)])).await.unwrap();
        l.learn("198.18.0.9".parse().unwrap(), resolver, &answer).await.unwrap();
        assert_eq!(l.writer.lock().unwrap().written.len(), 1);
        // New rules replace the old ones.
        l.set_rules(vec![]);
        l.learn(client, resolver, &answer).await.unwrap();
        assert_eq!(l.writer.lock().unwrap().written.len(), 1);
    }
}
