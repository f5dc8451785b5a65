//! Stage 4, the edge: commits a rendered [`Ruleset`] to nftables as one atomic transaction.
//!
//! The [`Backend`] trait is the I/O seam: [`kernel::NftCli`] writes the kernel's tables (in a
//! given network namespace) as nf_tables netlink batches ([`netlink`]), through the real
//! `nft` for anything those do not encode, and reads them with `nft`; [`fake::FakeNft`]
//! applies scripts to an in-memory table with the kernel's checks. [`Applier`] holds the sync
//! logic and works with either:
//!
//! - The table and its base chain are created once and never deleted: deleting a base chain
//!   unregisters its hook and packets are dropped meanwhile (kube-network-policies #402). A
//!   full sync flushes flock's chains and maps, deletes everything but the base chain, and
//!   writes the rendered table — all in one transaction ([`transaction`]), so packets see the
//!   old ruleset or the new one, never a mix. Into a table that does not exist yet, the
//!   render alone is the transaction.
//! - A render equal to the last one applied is a no-op. Otherwise, once a full sync has
//!   succeeded, the transaction carries only the difference from the last applied ruleset
//!   ([`incremental_steps`], kube-proxy's nftables approach): new objects, element additions
//!   and deletions, changed chains flushed and rewritten, stale objects deleted. Its cost
//!   follows the size of the change, not of the table. Anything it cannot express (a changed
//!   declaration) takes the full path.
//! - A failed transaction leaves the previous ruleset in force and returns the error with
//!   nft's message; the next sync is a full one that re-reads which objects exist.
//! - [`Applier::check_drift`] compares what the kernel holds now with what it held right
//!   after flock's last transaction (the *baseline*), both read as typed objects from nft's
//!   JSON listing ([`state`]), so a periodic resync can repair edits made behind flock's back
//!   — and an nft upgrade that formats listings differently is not drift. The baseline is
//!   read after each transaction that changed the table ([`Applier::record_baseline`]; the
//!   agent defers it until it has acknowledged the sync, so the listing never delays a pod).
//!   Without a baseline the check answers [`Drift::Unverified`], and the caller repairs.
//!
//! It touches no table but `inet flock`.

pub mod fake;
pub mod kernel;
pub mod netlink;
pub(crate) mod state;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::nft::parse::Kind;
use crate::render::names::{FAMILY, TABLE};
use crate::render::{Chain, Element, Object, Ruleset, Set};
pub use netlink::ElementChange;

/// An object of the kernel's table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectInfo {
    pub(crate) kind: Kind,
    pub name: String,
    /// The kernel's handle (stable for the object's lifetime).
    pub handle: u64,
}

/// Why an apply, a check or a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("nft rejected the transaction ({context}): {message}")]
    Rejected { context: String, message: String },
    #[error("cannot run nft in {netns}: {error}")]
    Spawn { netns: String, error: std::io::Error },
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("cannot read table inet flock from nft: {0}")]
    List(String),
}

impl ApplyError {
    /// A short, stable label for the sync-failures metric.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            Self::Rejected { .. } => "nft_rejected",
            Self::Spawn { .. } => "nft_spawn",
            Self::Netns(_) => "netns",
            Self::List(_) => "nft_list",
        }
    }
}

/// The I/O seam: what the applier needs from nft.
pub trait Backend {
    /// Runs `script` as one atomic transaction (`nft -f -`).
    fn run(&mut self, script: &str) -> Result<(), ApplyError>;
    /// Validates `script` without committing it (`nft -c -f -`).
    fn check(&mut self, script: &str) -> Result<(), ApplyError>;
    /// The stateless listing of table `inet flock`, or `None` when the table does not exist.
    fn list_table(&mut self) -> Result<Option<String>, ApplyError>;
    /// What table `inet flock` holds, typed ([`state`]), or `None` when it does not exist.
    fn read_state(&mut self) -> Result<Option<state::TableState>, ApplyError>;
    /// The ruleset's generation, bumped by every committed transaction, when the backend can
    /// read it: a table read at a generation is still what it was while the generation is.
    fn generation(&mut self) -> Result<Option<state::Generation>, ApplyError> {
        Ok(None)
    }
    /// The chains, sets and maps of table `inet flock` (empty when it does not exist).
    fn list_objects(&mut self) -> Result<Vec<ObjectInfo>, ApplyError>;
    /// Deletes and adds elements of exact sets and maps, as one atomic transaction
    /// (by default as an nft script; the kernel backend sends a netlink batch).
    fn write_elements(&mut self, changes: &[ElementChange<'_>]) -> Result<(), ApplyError> {
        self.run(&element_script(changes))
    }
    /// An incremental transaction towards `next` as one atomic transaction (by default as an
    /// nft script; the kernel backend sends a netlink batch).
    fn write_steps(&mut self, steps: &[Step<'_>], _next: &Ruleset) -> Result<(), ApplyError> {
        self.run(&steps_script(steps))
    }
    /// The full sync of `rs` (rendered as `text`) as one atomic transaction over the table's
    /// `existing` objects: the render alone into a new table, else [`transaction`] (by
    /// default as an nft script; the kernel backend sends a netlink batch).
    fn write_full(&mut self, rs: &Ruleset, existing: &BTreeSet<(Kind, String)>, text: &str) -> Result<(), ApplyError> {
        if existing.is_empty() { self.run(text) } else { self.run(&transaction(rs, existing, text)) }
    }
}

/// What an apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Equal to the last applied content: nothing sent.
    Unchanged,
    /// One transaction committed: only the difference from the last one (`incremental`), or
    /// the whole table.
    Applied { stale_deleted: usize, incremental: bool },
}

/// Result of comparing the kernel's table with what was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// Nothing applied yet: nothing to compare.
    NotApplied,
    /// The kernel holds what flock applied.
    InSync,
    /// The table is gone.
    Missing,
    /// The table differs from the baseline: what differs first.
    Changed { first_difference: String },
    /// No baseline was read since the last transaction: what the kernel holds cannot be
    /// vouched for (repair it).
    Unverified,
}

struct Applied {
    /// What the kernel holds: compared with the next render, and the base of the next
    /// incremental transaction.
    rs: Ruleset,
}

impl Applied {
    fn new(rs: Ruleset) -> Self {
        Self { rs }
    }
}

/// Elements past which a replaced ruleset is freed on a thread of its own: freeing the sets a
/// change replaced (150k pod addresses) takes milliseconds the change should not wait for.
const FREE_ASIDE: usize = 20_000;

/// Drops `old`, a large one on another thread (inline if no thread can be started).
fn retire(old: Option<Applied>) {
    if let Some(old) = old.filter(|o| o.rs.stats().elements > FREE_ASIDE) {
        free_aside(old);
    }
}

/// Drops `v` on a thread of its own (inline if none can be started).
fn free_aside<T: Send + 'static>(v: T) {
    let _ = std::thread::Builder::new().name("flock-free".into()).spawn(move || drop(v));
}

/// Applies rulesets through a [`Backend`], de-duplicated against the last applied one.
pub struct Applier<B> {
    backend: B,
    last: Option<Applied>,
    /// Set after any failure or drift: the next apply re-reads which objects exist.
    full: bool,
    /// What the kernel held after flock's last transaction (see the module doc).
    baseline: Option<state::TableState>,
    /// Whether [`Applier::apply`] leaves reading the baseline to the caller.
    defer_baseline: bool,
    /// Committed transactions so far: a baseline read beside the applier
    /// ([`Applier::baseline_reader`]) is taken only if no transaction committed since.
    commits: u64,
}

impl<B: Backend> Applier<B> {
    pub fn new(backend: B) -> Self {
        Self { backend, last: None, full: true, baseline: None, defer_baseline: false, commits: 0 }
    }

    /// Leaves reading the drift baseline after a transaction to the caller
    /// ([`Self::record_baseline`]), e.g. once the sync has been acknowledged.
    pub fn defer_baseline(mut self) -> Self {
        self.defer_baseline = true;
        self
    }

    /// Transactions committed so far (what [`Self::accept_baseline`] is told a read follows).
    #[cfg(feature = "testkit")]
    pub(crate) fn commits(&self) -> u64 {
        self.commits
    }

    /// Whether a transaction since the last baseline left it to be read.
    pub(crate) fn needs_baseline(&self) -> bool {
        self.last.is_some() && self.baseline.is_none()
    }

    /// Reads what the kernel holds now as the drift baseline.
    pub fn record_baseline(&mut self) -> Result<(), ApplyError> {
        self.baseline = if self.last.is_some() { read_settled(&mut self.backend)? } else { None };
        Ok(())
    }

    /// When a baseline is due: the commit it is for and a backend to read it with, so that
    /// the (for large tables, slow) listing runs beside the applier instead of blocking it.
    /// Hand the result to [`Self::accept_baseline`].
    pub(crate) fn baseline_reader(&self) -> Option<(u64, B)>
    where
        B: Clone,
    {
        self.needs_baseline().then(|| (self.commits, self.backend.clone()))
    }

    /// Takes a baseline read after commit `commit`; `false` (and nothing changes) when another
    /// transaction committed since, which makes the read stale.
    pub(crate) fn accept_baseline(&mut self, commit: u64, state: Option<state::TableState>) -> bool {
        if commit != self.commits || self.last.is_none() {
            return false;
        }
        self.baseline = state;
        true
    }

    /// A transaction committed: the baseline is read now, or left to the caller.
    fn committed(&mut self) -> Result<(), ApplyError> {
        self.commits += 1;
        // A transaction outdates the baseline; a large one (every element of the table, read
        // back) is freed aside, not on the change's path (7 ms at 77k elements).
        if let Some(old) = self.baseline.take().filter(|b| b.elements() > FREE_ASIDE) {
            free_aside(old);
        }
        if self.defer_baseline { Ok(()) } else { self.record_baseline() }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Forces the next [`apply`](Self::apply) to be a full sync that re-reads the kernel.
    pub fn invalidate(&mut self) {
        self.full = true;
    }

    /// Commits `rs` unless it equals the last applied ruleset.
    pub fn apply(&mut self, rs: &Ruleset) -> Result<Outcome, ApplyError> {
        if !self.full && self.last.as_ref().is_some_and(|l| l.rs == *rs) {
            return Ok(Outcome::Unchanged);
        }
        // Only elements of exact sets changed (a pod came or went): no nft process.
        let written = match self.last.as_ref().filter(|_| !self.full).and_then(|last| element_changes(&last.rs, rs)) {
            Some(changes) => Some(self.backend.write_elements(&changes)),
            None => None,
        };
        match written {
            Some(Ok(())) => {
                retire(self.last.replace(Applied::new(rs.clone())));
                self.committed()?;
                return Ok(Outcome::Applied { stale_deleted: 0, incremental: true });
            }
            // The kernel is not what flock believed: the full path below re-reads it.
            Some(Err(e)) => {
                tracing::warn!(error = %e, "element update failed; falling back to a full sync");
                self.full = true;
            }
            None => {}
        }
        let desired: BTreeSet<(Kind, String)> = rs.objects.iter().map(object_key).collect();
        if let Some(last) = self.last.as_ref().filter(|_| !self.full)
            && let Some(steps) = incremental_steps(&last.rs, rs)
        {
            let stale_deleted = last.rs.objects.iter().filter(|o| !desired.contains(&object_key(o))).count();
            match self.backend.write_steps(&steps, rs) {
                Ok(()) => {
                    retire(self.last.replace(Applied::new(rs.clone())));
                    self.committed()?;
                    return Ok(Outcome::Applied { stale_deleted, incremental: true });
                }
                // The kernel is not what flock believed: the full path below re-reads it.
                Err(e) => {
                    tracing::warn!(error = %e, "incremental nft transaction failed; falling back to a full sync");
                    self.full = true;
                }
            }
        }
        let text = rs.to_text();
        let existing: BTreeSet<(Kind, String)> = match (&self.last, self.full) {
            (Some(last), false) => last.rs.objects.iter().map(object_key).collect(),
            (None, _) => {
                // First sync of this process. No table: nothing to flush or delete. A table
                // with exactly this content (a restart): adopt it instead of rewriting it.
                match self.backend.list_table()? {
                    None => BTreeSet::new(),
                    Some(listing) => {
                        let canonical = crate::nft::canonical(&text).unwrap_or_default();
                        if crate::nft::canonical(&listing).is_ok_and(|c| c == canonical) {
                            self.last = Some(Applied::new(rs.clone()));
                            self.full = false;
                            // Verified just now: the baseline is read at once (once per start).
                            self.record_baseline()?;
                            return Ok(Outcome::Unchanged);
                        }
                        // Another agent's table (an upgrade, a downgrade, a changed cluster):
                        // replaced below in one transaction, never flushed and refilled.
                        match crate::render::table_format(&listing) {
                            Some(f) if f == crate::render::RULESET_FORMAT => {
                                tracing::info!(
                                    format = f,
                                    "adopting the table on this node (same ruleset format): updating it in one transaction"
                                )
                            }
                            Some(f) => tracing::info!(
                                found = f,
                                writes = crate::render::RULESET_FORMAT,
                                "adopting a table another flock-agent version wrote (another ruleset format): replacing it in one transaction"
                            ),
                            None => tracing::warn!("table flock exists but names no flock ruleset format: replacing it in one transaction"),
                        }
                        self.list_existing()?
                    }
                }
            }
            (Some(_), true) => self.list_existing()?,
        };
        let stale = existing.difference(&desired).count();
        let result = self.backend.write_full(rs, &existing, &text);
        let result = result.or_else(|first| {
            // The kernel's table is not what flock believed (edited by hand, left by another
            // version, an object with other attributes): rebuild from a fresh listing, in one
            // nft transaction, before giving up.
            let existing = self.list_existing()?;
            self.backend.run(&transaction(rs, &existing, &text)).map_err(|_| first)
        });
        match result {
            Ok(()) => {
                self.last = Some(Applied::new(rs.clone()));
                self.full = false;
                self.committed()?;
                Ok(Outcome::Applied { stale_deleted: stale, incremental: false })
            }
            Err(e) => {
                self.full = true;
                Err(e)
            }
        }
    }

    fn list_existing(&mut self) -> Result<BTreeSet<(Kind, String)>, ApplyError> {
        Ok(self.backend.list_objects()?.into_iter().map(|o| (o.kind, o.name)).collect())
    }

    /// Validates `rs` against the current kernel state without committing.
    #[cfg(test)]
    pub(crate) fn check(&mut self, rs: &Ruleset) -> Result<(), ApplyError> {
        let existing: BTreeSet<(Kind, String)> = self.backend.list_objects()?.into_iter().map(|o| (o.kind, o.name)).collect();
        let text = rs.to_text();
        self.backend.check(&transaction(rs, &existing, &text))
    }

    /// Compares the kernel's table with the last applied ruleset.
    pub fn check_drift(&mut self) -> Result<Drift, ApplyError> {
        if self.last.is_none() {
            return Ok(Drift::NotApplied);
        }
        // Nothing committed since the baseline was read: the table is what it was.
        if let Some(state::TableState::Netlink(baseline)) = &self.baseline
            && self.backend.generation()? == Some(baseline.generation)
        {
            return Ok(Drift::InSync);
        }
        let Some(now) = self.backend.read_state()? else { return Ok(Drift::Missing) };
        let Some(baseline) = &self.baseline else { return Ok(Drift::Unverified) };
        let Some(mut difference) = now.first_difference(baseline) else { return Ok(Drift::InSync) };
        // A difference counts once a second read shows it too (see `read_settled`).
        for _ in 0..2 {
            let Some(again) = self.backend.read_state()? else { return Ok(Drift::Missing) };
            match again.first_difference(baseline) {
                None => return Ok(Drift::InSync),
                Some(d) if d == difference => break,
                Some(d) => difference = d,
            }
        }
        Ok(Drift::Changed { first_difference: difference })
    }
}

/// What the kernel holds, read until two reads agree (at most three). A set whose hash table
/// the kernel is still growing — just after many elements went in — may list an element
/// twice or miss one while the table is rehashed (measured: right after a transaction
/// writing 225,000 elements, some reads of a set of 150,000 differed from the next); the
/// table it settles to is what two agreeing reads show.
fn read_settled<B: Backend>(backend: &mut B) -> Result<Option<state::TableState>, ApplyError> {
    let mut last = backend.read_state()?;
    for _ in 0..2 {
        let again = backend.read_state()?;
        if again == last {
            break;
        }
        last = again;
    }
    Ok(last)
}

fn object_key(o: &Object) -> (Kind, String) {
    let kind = match o.keyword() {
        "chain" => Kind::Chain,
        "map" => Kind::Map,
        _ => Kind::Set,
    };
    (kind, o.name().to_string())
}

/// One step of an incremental transaction ([`incremental_steps`]).
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// A new chain, set or map, declared without content.
    Declare(&'a Object),
    /// A chain's rules, or a set's or map's elements, removed (`keyword`: `chain`, `set`,
    /// `map`).
    Flush {
        keyword: &'static str,
        name: &'a str,
    },
    DeleteElements {
        set: &'a Set,
        elements: Vec<&'a Element>,
    },
    AddElements {
        set: &'a Set,
        elements: Vec<&'a Element>,
    },
    /// A chain's rules, appended.
    Rules(&'a Chain),
    Delete {
        keyword: &'static str,
        name: &'a str,
    },
}

/// The transaction that turns `prev` (what the kernel holds) into `next`, touching only what
/// differs; `None` when the change needs the full path (a declaration or the table comment
/// changed). Order, so that every reference resolves at each step: declare new objects;
/// flush changed chains and stale objects (dropping their references); delete removed elements and
/// flush changed interval sets; add elements; write the rules of new and changed chains;
/// delete stale chains, then maps, then sets.
pub fn incremental_steps<'a>(prev: &'a Ruleset, next: &'a Ruleset) -> Option<Vec<Step<'a>>> {
    use std::collections::BTreeMap;
    if prev.comment != next.comment {
        return None;
    }
    let old: BTreeMap<&str, &Object> = prev.objects.iter().map(|o| (o.name(), o)).collect();
    let mut declare = Vec::new();
    let mut flush = Vec::new();
    let mut remove = Vec::new();
    let mut add = Vec::new();
    let mut rules = Vec::new();
    let mut delete = Vec::new();
    for o in &next.objects {
        let before = old.get(o.name()).copied();
        if let Some(b) = before
            && !b.same_declaration(o)
        {
            return None;
        }
        match o {
            Object::Chain(c) => {
                let Some(Object::Chain(b)) = before else {
                    declare.push(Step::Declare(o));
                    rules.push(Step::Rules(c));
                    continue;
                };
                if b.rules != c.rules {
                    flush.push(Step::Flush { keyword: "chain", name: &c.name });
                    rules.push(Step::Rules(c));
                }
            }
            Object::Set(set) => {
                let Some(Object::Set(b)) = before else {
                    declare.push(Step::Declare(o));
                    add.push(Step::AddElements { set, elements: set.elements.iter().collect() });
                    continue;
                };
                if b.elements == set.elements {
                    continue;
                }
                if set.interval {
                    // Interval elements may merge or overlap while half-updated: rewrite whole.
                    remove.push(Step::Flush { keyword: o.keyword(), name: &set.name });
                    add.push(Step::AddElements { set, elements: set.elements.iter().collect() });
                    continue;
                }
                let (gone, new) = element_difference(b, set);
                remove.push(Step::DeleteElements { set, elements: gone });
                add.push(Step::AddElements { set, elements: new });
            }
        }
    }
    let next_names: BTreeSet<&str> = next.objects.iter().map(Object::name).collect();
    for wanted in ["chain", "map", "set"] {
        for o in prev.objects.iter().filter(|o| o.keyword() == wanted && !next_names.contains(o.name())) {
            // Flushed first: a stale chain's rules and a stale map's elements may refer to
            // other stale objects.
            flush.push(Step::Flush { keyword: wanted, name: o.name() });
            delete.push(Step::Delete { keyword: wanted, name: o.name() });
        }
    }
    Some([declare, flush, remove, add, rules, delete].concat())
}

/// [`incremental_steps`] as an nft script.
pub fn incremental(prev: &Ruleset, next: &Ruleset) -> Option<String> {
    incremental_steps(prev, next).map(|steps| steps_script(&steps))
}

/// Incremental steps as an nft script.
pub fn steps_script(steps: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Declare(o) => {
                let _ = writeln!(out, "{}", o.declaration());
            }
            Step::Flush { keyword, name } => {
                let _ = writeln!(out, "flush {keyword} {FAMILY} {TABLE} {name}");
            }
            Step::DeleteElements { set, elements } => write_elements(&mut out, "delete", set, elements.iter().copied()),
            Step::AddElements { set, elements } => write_elements(&mut out, "add", set, elements.iter().copied()),
            Step::Rules(c) => write_rules(&mut out, c),
            Step::Delete { keyword, name } => {
                let _ = writeln!(out, "delete {keyword} {FAMILY} {TABLE} {name}");
            }
        }
    }
    out
}

/// The element changes from `prev` to `next` when nothing else differs — the same objects
/// with the same declarations and rules, only elements of exact (non-interval) sets and maps
/// changed — else `None`. A changed element (comment or verdict) is deleted and added again.
pub fn element_changes<'a>(prev: &'a Ruleset, next: &'a Ruleset) -> Option<Vec<ElementChange<'a>>> {
    if prev.comment != next.comment || prev.objects.len() != next.objects.len() {
        return None;
    }
    let mut changes = Vec::new();
    for (b, o) in prev.objects.iter().zip(&next.objects) {
        match (b, o) {
            (Object::Chain(b), Object::Chain(c)) => {
                if b != c {
                    return None;
                }
            }
            (Object::Set(b), Object::Set(set)) => {
                if b.elements == set.elements {
                    if b != set {
                        return None;
                    }
                    continue;
                }
                if set.interval || b.name != set.name || b.comment != set.comment || b.key != set.key || b.data != set.data || b.interval {
                    return None;
                }
                let (delete, add) = element_difference(b, set);
                changes.push(ElementChange { set, delete, add });
            }
            _ => return None,
        }
    }
    Some(changes)
}

/// The elements of `before` to delete and of `after` to add. A changed element (comment or
/// verdict) is deleted and added again.
fn element_difference<'a>(
    before: &'a crate::render::Set,
    after: &'a crate::render::Set,
) -> (Vec<&'a crate::render::Element>, Vec<&'a crate::render::Element>) {
    use std::cmp::Ordering;
    // Positions in key order: the elements' own where they are in it already (a peer set's
    // addresses), else sorted — one merge then finds the changes, with no index of every key
    // built per change (150k pods: a set of all of them).
    let in_key_order = |v: &[crate::render::Element]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        if !v.windows(2).all(|w| w[0].key <= w[1].key) {
            idx.sort_by(|&i, &j| v[i].key.cmp(&v[j].key));
        }
        idx
    };
    let (b, a) = (&before.elements[..], &after.elements[..]);
    // What both share at the start and at the end is unchanged (keys are unique in a set, so
    // an element there cannot be elsewhere in the other): a pod's change leaves a middle of
    // one element or two to merge.
    let pre = b.iter().zip(a).take_while(|(x, y)| x == y).count();
    let suf = b[pre..].iter().rev().zip(a[pre..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (b, a) = (&b[pre..b.len() - suf], &a[pre..a.len() - suf]);
    let (bi, ai) = (in_key_order(b), in_key_order(a));
    let (mut gone, mut new) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < bi.len() || j < ai.len() {
        let order = match (bi.get(i), ai.get(j)) {
            (Some(&x), Some(&y)) => b[x].key.cmp(&a[y].key),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match order {
            Ordering::Less => {
                gone.push(bi[i]);
                i += 1;
            }
            Ordering::Greater => {
                new.push(ai[j]);
                j += 1;
            }
            Ordering::Equal => {
                // A changed comment or verdict: deleted and added again.
                if b[bi[i]] != a[ai[j]] {
                    gone.push(bi[i]);
                    new.push(ai[j]);
                }
                i += 1;
                j += 1;
            }
        }
    }
    // In each set's own order, as the sets list them.
    gone.sort_unstable();
    new.sort_unstable();
    (gone.into_iter().map(|k| &b[k]).collect(), new.into_iter().map(|k| &a[k]).collect())
}

/// [`element_changes`] as an nft script (deletions first).
pub fn element_script(changes: &[ElementChange<'_>]) -> String {
    let mut out = String::new();
    for c in changes {
        write_elements(&mut out, "delete", c.set, c.delete.iter().copied());
    }
    for c in changes {
        write_elements(&mut out, "add", c.set, c.add.iter().copied());
    }
    out
}

fn write_rules(out: &mut String, c: &crate::render::Chain) {
    for r in c.rules.iter() {
        let _ = writeln!(out, "add rule {FAMILY} {TABLE} {} {r}", c.name);
    }
}

/// `add`/`delete element` for `elements` of `set`, in batches (one command per element
/// would make the script, and nft's parsing of it, much larger).
fn write_elements<'a>(out: &mut String, verb: &str, set: &crate::render::Set, elements: impl Iterator<Item = &'a crate::render::Element>) {
    let mut open = false;
    let mut n = 0;
    for e in elements {
        if !open {
            let _ = write!(out, "{verb} element {FAMILY} {TABLE} {} {{ ", set.name);
            open = true;
        } else {
            out.push_str(", ");
        }
        if verb == "add" {
            e.write(out);
        } else {
            let _ = write!(out, "{}", e.key);
        }
        n += 1;
        if n % 1000 == 0 {
            out.push_str(" }\n");
            open = false;
        }
    }
    if open {
        out.push_str(" }\n");
    }
}

/// Objects of the table, by kind and name.
pub(crate) type Objects<'a> = Vec<&'a (Kind, String)>;

/// What a full sync removes before writing the render, in an order the kernel accepts
/// whatever references exist: first every existing chain and map is flushed (rules and
/// verdict elements are what refer to sets and chains), then every existing set, map and
/// chain but the render's base chains is deleted, so the render declares each afresh, exactly
/// as rendered — the kernel does not update the comment of an object that exists. Sets cost
/// the same deleted as flushed (measured at 150k pods). The base chain is only flushed: it
/// keeps its hook (see the module doc).
///
/// The render's timed sets (domain rules' learned addresses, [`Set::timeout`]) are kept as
/// they are, elements and all: they hold what the DNS proxy learned, which no render has. The
/// render declares them again, which changes nothing in a set that exists.
pub(crate) fn full_sync_removals<'a>(rs: &Ruleset, existing: &'a BTreeSet<(Kind, String)>) -> (Objects<'a>, Objects<'a>) {
    let base: BTreeSet<&str> = rs.objects.iter().filter(|o| matches!(o, Object::Chain(c) if c.hook.is_some())).map(Object::name).collect();
    let timed: BTreeSet<&str> = rs.objects.iter().filter(|o| matches!(o, Object::Set(s) if s.timeout)).map(Object::name).collect();
    let flush = existing.iter().filter(|(k, _)| *k != Kind::Set).collect();
    let delete = [Kind::Set, Kind::Map, Kind::Chain]
        .into_iter()
        .flat_map(|kind| existing.iter().filter(move |(k, _)| *k == kind))
        .filter(|(k, name)| !(*k == Kind::Chain && base.contains(name.as_str())))
        .filter(|(k, name)| !(*k == Kind::Set && timed.contains(name.as_str())))
        .collect();
    (flush, delete)
}

/// The full-sync transaction as an nft script: the table (its comment), what
/// [`full_sync_removals`] removes, then the render's `text`. No separate declarations: nft
/// pays for every command.
pub fn transaction(rs: &Ruleset, existing: &BTreeSet<(Kind, String)>, text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 64 * existing.len());
    let _ = writeln!(s, "add table {FAMILY} {TABLE} {{ comment \"{}\"; }}", rs.comment);
    let (flush, delete) = full_sync_removals(rs, existing);
    for (kind, name) in flush {
        let _ = writeln!(s, "flush {kind} {FAMILY} {TABLE} {name}");
    }
    for (kind, name) in delete {
        let _ = writeln!(s, "delete {kind} {FAMILY} {TABLE} {name}");
    }
    s.push_str(text);
    s
}

#[cfg(test)]
mod tests;
