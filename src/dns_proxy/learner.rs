//! The DNS proxy's learner ([`super::proxy::Learner`]): which domain rules a pod's answer
//! feeds, and the addresses it teaches written into those rules' timed nft sets before the
//! pod sees the answer.
//!
//! A domain rule is what a policy's `domainNames` peer (or a run's `domains`) becomes on this
//! node: the addresses of the local pods it applies to, its name patterns, and its two timed
//! sets (one per family). The agent replaces the whole list after every committed sync
//! ([`DomainLearner::set_rules`]); an answer is matched by the name the pod asked for (the
//! CNAME chain's addresses belong to it, as the NPEP says), and every rule it matches for
//! that pod gets the addresses, in one netlink batch.
//!
//! Learned addresses are bounded ([`LearnedBounds`]): per set (a rule's, one family) and on
//! the node. The learner keeps what each set holds and until when (read back from the kernel
//! the first time it writes a set, so what an earlier run learned counts); a new address
//! beyond a bound evicts the addresses that expire first — deleted in the same batch that adds
//! it, or, within [`EVICT_MARGIN`] of their expiry, simply left to expire — and evictions are
//! counted. A pod flooding answers with thousands of addresses thus keeps each set at its
//! bound, the node's table small and the drift check's listing bounded.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::proxy::Learner;
use crate::apply::netlink::timed::TimedElement;
use crate::apply::netlink::{NetlinkError, NfSocket};
use crate::dns::{DomainPattern, Learned};

/// What the learner reports after each answer it wrote (the agent's metrics count it).
pub trait LearnedStats: Send + Sync {
    /// `addresses` learned for the domain rule named `rule` (its policy's).
    fn learned(&self, rule: &str, addresses: u64);
    /// Addresses `evicted` by one answer, and what the node's sets `held` after it.
    fn evicted(&self, evicted: u64, held: i64);
}

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

/// How many learned addresses a set, and the node, holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedBounds {
    pub per_set: usize,
    pub per_node: usize,
}

impl Default for LearnedBounds {
    /// NPEP-133 asks implementations to admit at least 100 addresses per name; a rule's set
    /// serves every name of its patterns, so 2,048 per set and family, 16,384 on the node (a
    /// few megabytes in the kernel, and what a drift check lists stays small).
    fn default() -> Self {
        Self { per_set: 2048, per_node: 16_384 }
    }
}

/// An address this close to its expiry is left to expire rather than deleted to make room:
/// the kernel may already have dropped it, and deleting what is gone fails the batch.
pub(crate) const EVICT_MARGIN: Duration = Duration::from_secs(2);

/// Writes learned elements into timed sets (the kernel's: [`NfSocket`]; a fake in tests).
pub trait TimedWriter: Send + 'static {
    /// In one transaction: deletes `evict`'s addresses from their sets, then adds `sets`'
    /// elements.
    fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)], evict: &[(String, Vec<IpAddr>)]) -> Result<(), NetlinkError>;
    /// What timed set `set` holds: each address and what is left of its timeout.
    fn read_timed(&mut self, set: &str) -> Result<Vec<(IpAddr, Duration)>, NetlinkError>;
}

/// Opens its socket on first use, in the namespace of the thread that writes first (the
/// agent's: the node's), and again after an error (a socket that failed may hold replies).
#[derive(Default)]
pub struct KernelWriter {
    socket: Option<NfSocket>,
}

impl KernelWriter {
    fn socket(&mut self) -> Result<&mut NfSocket, NetlinkError> {
        match self.socket {
            Some(ref mut s) => Ok(s),
            None => Ok(self.socket.insert(NfSocket::open()?)),
        }
    }
}

impl TimedWriter for KernelWriter {
    fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)], evict: &[(String, Vec<IpAddr>)]) -> Result<(), NetlinkError> {
        let written = self.socket()?.write_timed(sets, evict);
        if written.is_err() {
            self.socket = None;
        }
        written
    }

    fn read_timed(&mut self, set: &str) -> Result<Vec<(IpAddr, Duration)>, NetlinkError> {
        let read = self.socket()?.dump_timed(set);
        if read.is_err() {
            self.socket = None;
        }
        Ok(read?.into_iter().map(|e| (e.addr, e.expires_in)).collect())
    }
}

/// What the timed sets hold, as the learner wrote it.
#[derive(Debug, Default)]
struct Held {
    /// Per set: each address and when it expires.
    sets: HashMap<String, HashMap<IpAddr, Instant>>,
    /// Addresses in all sets.
    total: usize,
    /// When expired entries were last dropped.
    pruned: Option<Instant>,
}

impl Held {
    /// Forgets what expired (at most once a second: until then, expired entries count against
    /// the bounds, which only evicts a little early).
    fn prune(&mut self, now: Instant) {
        if self.pruned.is_some_and(|p| now.duration_since(p) < Duration::from_secs(1)) {
            return;
        }
        self.pruned = Some(now);
        for entries in self.sets.values_mut() {
            entries.retain(|_, expiry| *expiry > now);
        }
        self.sets.retain(|_, e| !e.is_empty());
        self.total = self.sets.values().map(HashMap::len).sum();
    }

    /// The `n` entries of `set` (of any set, with `None`) that expire first, not in `keep`.
    fn soonest(&self, set: Option<&str>, n: usize, keep: &BTreeSet<(String, IpAddr)>) -> Vec<(String, IpAddr, Instant)> {
        let mut all: Vec<(Instant, &String, IpAddr)> = self
            .sets
            .iter()
            .filter(|(name, _)| set.is_none_or(|s| s == name.as_str()))
            .flat_map(|(name, entries)| entries.iter().map(move |(a, e)| (*e, name, *a)))
            .filter(|(_, name, a)| !keep.contains(&((*name).clone(), *a)))
            .collect();
        all.sort();
        all.into_iter().take(n).map(|(e, name, a)| (name.clone(), a, e)).collect()
    }

    fn remove(&mut self, set: &str, addr: IpAddr) {
        if self.sets.get_mut(set).and_then(|e| e.remove(&addr)).is_some() {
            self.total -= 1;
        }
    }

    fn insert(&mut self, set: &str, addr: IpAddr, expiry: Instant) {
        let entries = self.sets.entry(set.to_string()).or_default();
        match entries.get_mut(&addr) {
            Some(e) => *e = (*e).max(expiry),
            None => {
                entries.insert(addr, expiry);
                self.total += 1;
            }
        }
    }
}

/// The learner: the current domain rules, what the sets hold, and the writer.
pub struct DomainLearner<W> {
    rules: RwLock<Arc<Vec<DomainRule>>>,
    bounds: LearnedBounds,
    /// Counts the addresses each rule learned.
    metrics: Option<Arc<dyn LearnedStats>>,
    // A std mutex held across one netlink batch: the kernel answers at once (no network), and
    // the answer waits for it anyway. What the sets hold changes only with a write.
    writer: Mutex<(W, Held)>,
}

impl<W: TimedWriter> DomainLearner<W> {
    pub fn new(writer: W) -> Self {
        Self {
            rules: RwLock::new(Arc::new(Vec::new())),
            bounds: LearnedBounds::default(),
            metrics: None,
            writer: Mutex::new((writer, Held::default())),
        }
    }

    /// With other bounds on what the sets hold.
    pub(crate) fn with_bounds(mut self, bounds: LearnedBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Counting what each rule learns in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Arc<dyn LearnedStats>) -> Self {
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
    pub(crate) fn elements(&self, client: IpAddr, learned: &Learned) -> Vec<(String, Vec<TimedElement>)> {
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

    /// The addresses held now, in all sets (what expired up to a second ago may count).
    pub(crate) fn held(&self) -> usize {
        self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.total
    }

    /// Writes `elements` within the bounds: each set's new addresses beyond its bound (and the
    /// node's) evict those that expire first. Returns how many were evicted and how many of
    /// the answer's own were not learned (an answer alone larger than a set's bound).
    fn write_bounded(&self, mut elements: Vec<(String, Vec<TimedElement>)>) -> Result<(usize, usize), NetlinkError> {
        let mut guard = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (writer, held) = &mut *guard;
        let now = Instant::now();
        held.prune(now);
        // What earlier runs learned counts too: a set the learner has not written yet is read
        // back first.
        for (set, _) in &elements {
            if !held.sets.contains_key(set) {
                for (addr, left) in writer.read_timed(set)? {
                    held.insert(set, addr, now + left);
                }
            }
        }
        let mut dropped = 0;
        let keep: BTreeSet<(String, IpAddr)> =
            elements.iter().flat_map(|(set, es)| es.iter().map(move |e| (set.clone(), e.addr))).collect();
        let mut evict: Vec<(String, IpAddr, Instant)> = Vec::new();
        let mut new_total = 0;
        for (set, es) in &mut elements {
            let have = held.sets.get(set.as_str());
            let is_new = |e: &TimedElement| have.is_none_or(|h| !h.contains_key(&e.addr));
            // An answer alone beyond the bound: the first addresses only.
            let new: Vec<usize> = es.iter().enumerate().filter(|(_, e)| is_new(e)).map(|(i, _)| i).collect();
            if new.len() > self.bounds.per_set {
                let cut: BTreeSet<usize> = new[self.bounds.per_set..].iter().copied().collect();
                dropped += cut.len();
                let mut i = 0;
                es.retain(|_| {
                    i += 1;
                    !cut.contains(&(i - 1))
                });
            }
            let fresh = es.iter().filter(|e| is_new(e)).count();
            let len = have.map_or(0, HashMap::len);
            let over = (len + fresh).saturating_sub(self.bounds.per_set);
            evict.extend(held.soonest(Some(set), over, &keep));
            new_total += fresh;
        }
        let over = (held.total + new_total).saturating_sub(evict.len()).saturating_sub(self.bounds.per_node);
        if over > 0 {
            let already: BTreeSet<(String, IpAddr)> = keep.iter().cloned().chain(evict.iter().map(|(s, a, _)| (s.clone(), *a))).collect();
            evict.extend(held.soonest(None, over, &already));
        }
        // Deleted from the kernel unless about to expire there anyway.
        let mut deletes: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (set, addr, expiry) in &evict {
            if expiry.saturating_duration_since(now) > EVICT_MARGIN {
                match deletes.iter_mut().find(|(s, _)| s == set) {
                    Some((_, v)) => v.push(*addr),
                    None => deletes.push((set.clone(), vec![*addr])),
                }
            }
        }
        elements.retain(|(_, es)| !es.is_empty());
        if let Err(e) = writer.write_timed(&elements, &deletes) {
            // What those sets hold is unknown now: read them back next time.
            let touched: BTreeSet<&String> = elements.iter().map(|(s, _)| s).chain(deletes.iter().map(|(s, _)| s)).collect();
            for set in touched {
                if let Some(entries) = held.sets.remove(set.as_str()) {
                    held.total -= entries.len();
                }
            }
            return Err(e);
        }
        for (set, addr, _) in &evict {
            held.remove(set, *addr);
        }
        for (set, es) in &elements {
            for e in es {
                held.insert(set, e.addr, now + e.timeout);
            }
        }
        Ok((evict.len(), dropped))
    }
}

impl<W: TimedWriter> Learner for DomainLearner<W> {
    async fn learn(&self, client: IpAddr, _resolver: SocketAddr, learned: &Learned) -> Result<(), NetlinkError> {
        let elements = self.elements(client, learned);
        if elements.is_empty() {
            return Ok(());
        }
        let written = self.write_bounded(elements);
        if let (Ok((evicted, dropped)), Some(m)) = (&written, &self.metrics) {
            for rule in self.rules().iter().filter(|r| r.pods.contains(&client) && r.patterns.iter().any(|p| p.matches(&learned.name))) {
                m.learned(&rule.source, learned.addresses.len().saturating_sub(*dropped) as u64);
            }
            m.evicted(*evicted as u64, self.held() as i64);
        }
        written.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        written: Vec<Vec<(String, Vec<TimedElement>)>>,
        evicted: Vec<Vec<(String, Vec<IpAddr>)>>,
        /// What every set holds when first read (an earlier run's).
        in_kernel: Vec<(IpAddr, Duration)>,
    }

    impl TimedWriter for Fake {
        fn write_timed(&mut self, sets: &[(String, Vec<TimedElement>)], evict: &[(String, Vec<IpAddr>)]) -> Result<(), NetlinkError> {
            self.written.push(sets.to_vec());
            self.evicted.push(evict.to_vec());
            Ok(())
        }

        fn read_timed(&mut self, _set: &str) -> Result<Vec<(IpAddr, Duration)>, NetlinkError> {
            Ok(self.in_kernel.clone())
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
        let written = l.writer.lock().unwrap().0.written.clone();
        assert_eq!(written.len(), 1, "one batch per answer");
        let sets: Vec<&str> = written[0].iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(sets, vec!["a-v4", "a-v6", "b-v4", "b-v6"]);
        assert_eq!(written[0][0].1[0].timeout, Duration::from_secs(60));
        assert_eq!(written[0][1].1[0].timeout, Duration::from_secs(30));
        assert_eq!(written[0][0].1[0].comment, "files.pypi.org (via dualstack.x.example)");
        // A name no rule of the pod admits, and another pod's rule: nothing written.
        l.learn(client, resolver, &learned("pypi.org", &[], &[("198.18.5.2", 60)])).await.unwrap();
        l.learn("198.18.0.9".parse().unwrap(), resolver, &answer).await.unwrap();
        assert_eq!(l.writer.lock().unwrap().0.written.len(), 1);
        // New rules replace the old ones.
        l.set_rules(vec![]);
        l.learn(client, resolver, &answer).await.unwrap();
        assert_eq!(l.writer.lock().unwrap().0.written.len(), 1);
    }

    /// The attack: a pod's answers flood a rule's set with addresses. The set keeps its bound
    /// (the addresses that expire first make room), the node its own, and what an earlier run
    /// learned counts from the first write on.
    #[tokio::test]
    async fn learned_addresses_stay_within_their_bounds_evicting_what_expires_first() {
        let l = DomainLearner::new(Fake { in_kernel: vec![("198.18.9.9".parse().unwrap(), Duration::from_secs(5))], ..Fake::default() })
            .with_bounds(LearnedBounds { per_set: 4, per_node: 6 });
        l.set_rules(vec![rule("a", &["198.18.0.7"], &["*.example.com"]), rule("b", &["198.18.0.7"], &["*.example.org"])]);
        let client: IpAddr = "198.18.0.7".parse().unwrap();
        let resolver: SocketAddr = "198.18.0.53:53".parse().unwrap();
        // a-v4 holds an earlier run's 198.18.9.9 (5 s left); three more fit.
        let three: Vec<(String, u32)> = (1..=3).map(|i| (format!("198.18.1.{i}"), 100 * i)).collect();
        let three: Vec<(&str, u32)> = three.iter().map(|(a, t)| (a.as_str(), *t)).collect();
        l.learn(client, resolver, &learned("x.example.com", &[], &three)).await.unwrap();
        assert_eq!(l.held(), 4);
        assert!(l.writer.lock().unwrap().0.evicted.last().unwrap().is_empty());
        // Two more: the two that expire first go, the earlier run's among them.
        l.learn(client, resolver, &learned("y.example.com", &[], &[("198.18.2.1", 600), ("198.18.2.2", 600)])).await.unwrap();
        assert_eq!(l.held(), 4);
        let evicted = l.writer.lock().unwrap().0.evicted.last().unwrap().clone();
        assert_eq!(evicted, vec![("a-v4".to_string(), vec!["198.18.9.9".parse().unwrap(), "198.18.1.1".parse().unwrap()])]);
        // An answer alone larger than the set: its first four addresses only.
        let many: Vec<String> = (1..=10).map(|i| format!("198.18.3.{i}")).collect();
        let many: Vec<(&str, u32)> = many.iter().map(|a| (a.as_str(), 900)).collect();
        l.learn(client, resolver, &learned("z.example.com", &[], &many)).await.unwrap();
        assert_eq!(l.held(), 4);
        let written = l.writer.lock().unwrap().0.written.last().unwrap().clone();
        assert_eq!(written[0].1.len(), 4);
        // The node's bound: b-v4 starts with the earlier run's address, then gets three; the
        // node holds at most six, a-v4's soonest make room.
        l.learn(client, resolver, &learned("w.example.org", &[], &three)).await.unwrap();
        assert_eq!(l.held(), 6);
        let evicted = l.writer.lock().unwrap().0.evicted.last().unwrap().clone();
        assert_eq!(evicted.iter().map(|(_, v)| v.len()).sum::<usize>(), 2, "{evicted:?}");
    }
}
