//! Stage 3, pure: [`NodePolicy`] → the complete desired content of table `inet flock`.
//!
//! A pure, deterministic function (no I/O, clock, process or async runtime; only ordered
//! collections): equal input gives byte-equal output. The output is nft text in the exact
//! form `nft list` prints it back (so a listing of the kernel's table can be compared with
//! it), and it is what the applier sends. Text rather than nft's JSON: nft 1.0.6's JSON input
//! drops table, chain and set comments, which are half of the point of this ruleset.
//!
//! The ruleset (docs/troubleshooting.md, "Reading the ruleset"):
//!
//! ```text
//! chain forward            filter hook forward, priority filter (after kube-proxy's DNAT)
//!   ct mark & 0x01000000 == 0x01000000 goto revoked   a connection revoked (`crate::revoke`)
//!   ct state established,related accept; ct state invalid drop
//!   iifname "flk*" jump from-pods        a packet leaving a local pod
//!   oifname "flk*" jump to-pods          a packet entering a local pod
//! chain from-pods
//!   iifname . ip saddr != @pod-addrs-v4 drop      unknown interface or spoofed source
//!   iifname vmap @egress-chains                   jump egress-…: allowed → egress-allowed, else drop
//! chain egress-allowed
//!   oifname "flk*" goto to-pods                   the destination's ingress policy decides
//!   accept
//! chain to-pods
//!   oifname vmap @ingress-chains                  goto ingress-…: final verdict, or accept
//!   drop                                          unknown pod interface (fail closed)
//! ```
//!
//! Per endpoint and direction that something restricts, one chain (or a few: see
//! `Renderer::endpoint_chains`) evaluating, in order, the Admin tier of
//! ClusterNetworkPolicy, NetworkPolicy (allow rules, then drop, when it isolates the pod), the
//! Baseline tier, then the default (allow). Every verdict is final — an allowed egress packet
//! goes to the destination's ingress policy through `egress-allowed` — so a verdict can be
//! given at any depth and `Pass` is a `goto`. NetworkPolicy allow rules become a constant
//! number of lookups through peer classes ([`peers`]): the pod's rules never grow with its
//! policies, rules or peers. ClusterNetworkPolicy rules keep their order (first match
//! decides), each rule one lookup in a shared peer set (one per peer definition and family,
//! `flags interval` for ipBlocks and networks, `addr . proto . port` concatenations for
//! named ports). Object order in the text satisfies nft's references: sets,
//! then each chain after the chains it refers to (ingress chains, their map, `to-pods`,
//! `egress-allowed`, egress chains, their map, `from-pods`, `forward`).

pub mod digest;
pub(crate) mod element;
pub mod log;
pub mod names;
mod peers;
pub(crate) mod rule;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::model::Family;
use crate::translate::{
    Action, AllowRule, Changed, Direction, DirectionPolicy, DomainDef, EndpointPolicy, Isolation, NamedPortDef, NodePolicy, PeerDef,
    PeerMatch, PortMatch, PortRanges, PriorityGroup, Tier, TierRule, par,
};
pub use element::{Element, Key, KeyPart};
use names::comment;
use peers::PeerPlan;
pub use rule::{CtState, Field, IcmpV6, Ports, Proto, Rule, Stmt, Verdict};

/// The base chain and the static objects (names are part of flock's contract with operators).
pub const BASE_CHAIN: &str = "forward";
/// The base chain of packets to the node's own addresses (hook `input`), and where it sends
/// those of local pods: their egress policy judges them as it judges forwarded ones.
pub const INPUT_CHAIN: &str = "input";
pub const TO_NODE: &str = "to-node";
pub const FROM_PODS: &str = "from-pods";
pub const TO_PODS: &str = "to-pods";
pub(crate) const POD_ADDRS_V4: &str = "pod-addrs-v4";
pub(crate) const POD_ADDRS_V6: &str = "pod-addrs-v6";
/// Every IPv6 pod's host interface with each source its neighbour discovery and MLD may have:
/// the link-local address flock-cni gives its pod side (`flock_cni::pod_link_local`), its own
/// addresses and `::`; each element with a limiter of its own ([`ND_LIMIT`]).
pub(crate) const POD_ND_SOURCES: &str = "pod-nd-sources";
/// The rate (per second) and burst of each source of [`POD_ND_SOURCES`]: pods flock-cni wires
/// know their gateway from the start and send next to nothing of this kind; beyond it, their
/// packets meet the source check (dropped as spoofed).
pub(crate) const ND_LIMIT: (u32, u32) = (10, 50);
pub const EGRESS_MAP: &str = "egress-chains";
pub const INGRESS_MAP: &str = "ingress-chains";
/// Where an allowed egress packet goes: on to the destination's ingress policy (a pod on this
/// node) or out.
pub const EGRESS_ALLOWED: &str = "egress-allowed";
/// The audit mode's counterparts of the dispatch chains and maps, and its base chain
/// (before the enforcing one: it never drops).
pub const AUDIT_BASE_CHAIN: &str = "audit";
pub(crate) const AUDIT_INPUT_CHAIN: &str = "audit-input";
pub(crate) const AUDIT_FROM_PODS: &str = "audit-from-pods";
pub(crate) const AUDIT_TO_PODS: &str = "audit-to-pods";
pub(crate) const AUDIT_EGRESS_ALLOWED: &str = "audit-egress-allowed";
pub(crate) const AUDIT_INGRESS_MAP: &str = "audit-ingress-chains";
pub(crate) const AUDIT_EGRESS_MAP: &str = "audit-egress-chains";
/// DNS steering (see [`DnsSteer`]): the base chains, the set of pod interfaces whose DNS goes
/// to the proxy, the trusted resolvers.
pub(crate) const DNS_STEER_CHAIN: &str = "dns-steer";
pub const DNS_PROXY_CHAIN: &str = "dns-proxy";
pub(crate) const DNS_UPSTREAM_CHAIN: &str = "dns-upstream";
pub(crate) const DNS_PROXIED: &str = "dns-proxied";
pub(crate) const DNS_RESOLVERS_V4: &str = "dns-resolvers-v4";
pub(crate) const DNS_RESOLVERS_V6: &str = "dns-resolvers-v6";
/// The ct mark bit of connections a domain rule admitted: the revocation judge keeps them
/// while the rule exists, whatever the address's TTL (established connections continue,
/// NPEP-133).
pub const DOMAIN_MARK: u32 = 0x0200_0000;
/// The packet mark bit of admitted DNS on its way to the proxy, by default.
pub const DNS_MARK: u32 = 0x0000_0080;
/// The packet mark bit of the DNS proxy's upstream queries (sent as the pod), by default:
/// chain `dns-upstream` marks their connections with [`DNS_PROXIED_MARK`] and sends those to
/// a resolver pod of this node through its ingress policy.
pub(crate) const DNS_UPSTREAM_MARK: u32 = 0x0000_0100;
/// The ct mark bit of the DNS proxy's upstream connections: their answers (addressed to the
/// pod) are marked for the proxy in `dns-proxy` and delivered to it by policy routing.
pub const DNS_PROXIED_MARK: u32 = 0x0400_0000;
/// Host-side pod interfaces flock owns (see `flock_cni::HOST_INTERFACE_PREFIX`).
pub(crate) const POD_INTERFACES: &str = "flk*";

/// The format of the table this renderer writes, named in the table's comment: an agent
/// that finds a table on start reads it ([`table_format`]) and knows what it adopts (tables
/// written before the marker existed are format 0). Bump it when the table's layout changes
/// in a way a reader of `nft list ruleset` (or a tool) would notice; an agent replaces any
/// table that is not exactly its render in one transaction, whatever its format.
pub const RULESET_FORMAT: u32 = 1;

const TABLE_COMMENT: &str =
    "flock ruleset format 1: NetworkPolicy enforcement for the pods of this node; managed by flock-agent, edits are reverted";

/// The ruleset format a table listing (`nft list table`) names in its comment: `Some(0)` for
/// a flock table from before the marker, `None` for a table flock did not write.
pub fn table_format(listing: &str) -> Option<u32> {
    let comment = listing.lines().map(str::trim).find_map(|l| l.strip_prefix("comment \""))?;
    if let Some(rest) = comment.strip_prefix("flock ruleset format ") {
        return rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok();
    }
    comment.starts_with("flock: ").then_some(0)
}

/// The base chain's hook; never changed once created (a changed hook would need a delete).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hook {
    pub(crate) type_: &'static str,
    pub(crate) hook: &'static str,
    pub(crate) priority: &'static str,
    pub(crate) policy: &'static str,
}

/// A chain and its rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub(crate) comment: String,
    pub hook: Option<Hook>,
    /// Shared, like a set's elements: a chain an endpoint's render keeps is the same
    /// allocation in the next ruleset, so copying a ruleset (to keep what was applied, to
    /// hash it) copies no rules, and comparing an unchanged chain is a pointer comparison.
    pub rules: Arc<Vec<Rule>>,
}

/// A named set, or a verdict map when `data` is set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    pub name: String,
    pub(crate) comment: String,
    /// Key types, concatenated with ` . ` (`type ipv4_addr . inet_service`); or, for a key
    /// with a raw payload field, the key's expressions (`typeof ip saddr . @th,336,32`).
    pub key: Vec<&'static str>,
    /// `Some("verdict")` for verdict maps.
    pub data: Option<&'static str>,
    pub interval: bool,
    /// Elements carry a timeout (`flags timeout`): a domain rule's set, whose elements the
    /// agent's DNS proxy writes as it learns them. Never rendered with elements; kept, with
    /// what it learned, across full syncs, and left out of drift checks.
    pub timeout: bool,
    /// `limit rate R/second burst B packets` (`(R, B)`): every element has a limiter of its
    /// own, and a lookup that finds an element over its rate does not match.
    pub limit: Option<(u32, u32)>,
    /// Shared: a set whose content did not change is the same allocation in the next render
    /// ([`RenderCache`]), so comparing it with the last applied one is a pointer comparison.
    pub elements: Arc<Vec<Element>>,
}

/// An object of the table, in the order it is written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Object {
    Set(Set),
    Chain(Chain),
}

impl Object {
    pub fn name(&self) -> &str {
        match self {
            Self::Set(s) => &s.name,
            Self::Chain(c) => &c.name,
        }
    }

    /// `chain`, `set` or `map`: the nft keyword for this object.
    pub(crate) fn keyword(&self) -> &'static str {
        match self {
            Self::Set(s) if s.data.is_some() => "map",
            Self::Set(_) => "set",
            Self::Chain(_) => "chain",
        }
    }

    /// An `add` command declaring this object with all its attributes and no content.
    /// Whether `other` has this object's [`declaration`](Self::declaration), compared
    /// field by field (the incremental path asks for every object on every sync).
    pub(crate) fn same_declaration(&self, other: &Object) -> bool {
        match (self, other) {
            (Self::Chain(a), Self::Chain(b)) => a.name == b.name && a.hook == b.hook && a.comment == b.comment,
            (Self::Set(a), Self::Set(b)) => {
                a.name == b.name
                    && a.key == b.key
                    && a.data == b.data
                    && a.interval == b.interval
                    && a.timeout == b.timeout
                    && a.limit == b.limit
                    && a.comment == b.comment
            }
            _ => false,
        }
    }

    pub(crate) fn declaration(&self) -> String {
        let (kw, name) = (self.keyword(), self.name());
        let mut s = format!("add {kw} {} {} {name} {{ ", names::FAMILY, names::TABLE);
        match self {
            Self::Chain(c) => {
                if let Some(h) = &c.hook {
                    let _ = write!(s, "type {} hook {} priority {}; policy {}; ", h.type_, h.hook, h.priority, h.policy);
                }
                let _ = write!(s, "comment \"{}\"; ", c.comment);
            }
            Self::Set(set) => {
                let _ = write!(s, "{}; ", set.type_text());
                if let Some(flags) = set.flags_text() {
                    let _ = write!(s, "flags {flags}; ");
                }
                if let Some(limit) = set.limit_text() {
                    let _ = write!(s, "{limit}; ");
                }
                let _ = write!(s, "comment \"{}\"; ", set.comment);
            }
        }
        s.push('}');
        s
    }
}

impl Set {
    /// The set's flags as nft writes them (`flags interval`, `flags timeout`), in order: the
    /// one list the text writers and the fuzz checks of a parsed render share.
    pub(crate) fn flags(&self) -> impl Iterator<Item = &'static str> {
        [(self.interval, "interval"), (self.timeout, "timeout")].into_iter().filter_map(|(on, flag)| on.then_some(flag))
    }

    /// The flags in one statement (`interval,timeout`), as `nft list` prints them: a second
    /// `flags` statement would replace the first, not add to it.
    fn flags_text(&self) -> Option<String> {
        let flags: Vec<&str> = self.flags().collect();
        (!flags.is_empty()).then(|| flags.join(","))
    }

    /// `limit rate R/second [burst B packets]`, as nft lists it.
    pub(crate) fn limit_text(&self) -> Option<String> {
        self.limit.map(|(rate, burst)| Stmt::Limit { rate, burst }.to_string())
    }

    /// Whether the key is declared by its expressions (`typeof`), not its types.
    pub(crate) fn is_typeof(&self) -> bool {
        self.key.iter().any(|k| k.contains(' ') || k.starts_with('@'))
    }

    /// `type K [: D]`, or `typeof K` for a key of expressions.
    fn type_text(&self) -> String {
        let kw = if self.is_typeof() { "typeof" } else { "type" };
        let key = self.key.join(" . ");
        match self.data {
            Some(d) => format!("{kw} {key} : {d}"),
            None => format!("{kw} {key}"),
        }
    }
}

/// The complete desired content of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ruleset {
    pub(crate) comment: String,
    /// In writing order (see the module doc).
    pub objects: Vec<Object>,
}

/// Sizes of a ruleset, for logs, metrics and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub chains: usize,
    pub rules: usize,
    pub sets: usize,
    pub elements: usize,
}

impl Ruleset {
    pub fn stats(&self) -> Stats {
        let mut st = Stats::default();
        for o in &self.objects {
            match o {
                Object::Chain(c) => {
                    st.chains += 1;
                    st.rules += c.rules.len();
                }
                Object::Set(s) => {
                    st.sets += 1;
                    st.elements += s.elements.len();
                }
            }
        }
        st
    }

    pub fn object(&self, name: &str) -> Option<&Object> {
        self.objects.iter().find(|o| o.name() == name)
    }

    /// The table as nft text: `table inet flock { ... }`, formatted as `nft list` prints it.
    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(out, "table {} {} {{", names::FAMILY, names::TABLE);
        let _ = writeln!(out, "\tcomment \"{}\"", self.comment);
        for (i, o) in self.objects.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            match o {
                Object::Set(s) => write_set(&mut out, o.keyword(), s),
                Object::Chain(c) => write_chain(&mut out, c),
            }
        }
        out.push_str("}\n");
        out
    }
}

fn write_set(out: &mut String, keyword: &str, s: &Set) {
    let _ = writeln!(out, "\t{keyword} {} {{", s.name);
    let _ = writeln!(out, "\t\t{}", s.type_text());
    if let Some(flags) = s.flags_text() {
        let _ = writeln!(out, "\t\tflags {flags}");
    }
    if let Some(limit) = s.limit_text() {
        let _ = writeln!(out, "\t\t{limit}");
    }
    let _ = writeln!(out, "\t\tcomment \"{}\"", s.comment);
    for (i, e) in s.elements.iter().enumerate() {
        out.push_str(if i == 0 { "\t\telements = { " } else { ",\n\t\t\t     " });
        e.write(out);
    }
    if !s.elements.is_empty() {
        out.push_str(" }\n");
    }
    out.push_str("\t}\n");
}

fn write_chain(out: &mut String, c: &Chain) {
    let _ = writeln!(out, "\tchain {} {{", c.name);
    let _ = writeln!(out, "\t\tcomment \"{}\"", c.comment);
    if let Some(h) = &c.hook {
        let _ = writeln!(out, "\t\ttype {} hook {} priority {}; policy {};", h.type_, h.hook, h.priority, h.policy);
    }
    for r in c.rules.iter() {
        let _ = writeln!(out, "\t\t{r}");
    }
    out.push_str("\t}\n");
}

/// The nft type of a family's addresses.
fn addr_type(fam: Family) -> &'static str {
    match fam {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    }
}

/// One endpoint's chains of one direction, in reference order, and its entry chain's name.
type EndpointChains = (String, Vec<Chain>);

/// One endpoint direction's chains: the enforced view's entry, the audited view's entry,
/// and every chain of both (each before the chains that refer to it).
struct Rendered {
    entry: Option<String>,
    audit_entry: Option<String>,
    chains: Vec<Chain>,
}

/// How the DNS of pods with domain rules reaches the agent's DNS proxy
/// (`crate::dns_proxy::proxy`), and which resolvers it trusts.
///
/// A query of such a pod to a trusted resolver is judged by the pod's own egress policy
/// first (chain `dns-steer`, in prerouting after the Service DNAT, jumps `from-pods` — the
/// very chains `forward` uses): what the policy denies is dropped there, exactly as without
/// the proxy; what it admits is marked and handed by `tproxy` to the proxy's listeners on
/// 127.0.0.1 and ::1 (chain `dns-proxy`), and a marked packet no proxy takes is dropped (fail
/// closed). The agent routes marked packets to the node itself (an `ip rule` on the mark).
///
/// The proxy asks the resolver as the pod (its source address, the upstream mark): chain
/// `dns-upstream` (hook output) marks those connections with `proxied_mark` and sends a query
/// to a resolver pod of this node through that pod's ingress policy (`to-pods`), as its own
/// query would go; `dns-proxy` marks their answers for the proxy — those from a pod interface
/// only from the resolver's own address (forged ones are dropped) — so policy routing delivers
/// them to the proxy, not to the pod whose address they are sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSteer {
    /// The proxy's port (on the loopback addresses; tproxy delivers there).
    pub(crate) port: u16,
    /// The packet mark bit of admitted DNS on its way to the proxy.
    pub(crate) mark: u32,
    /// The packet mark bit of the proxy's upstream queries, and the ct mark bit of their
    /// connections.
    pub(crate) upstream_mark: u32,
    pub(crate) proxied_mark: u32,
    /// Trusted resolvers' addresses as pods address them after the Service's DNAT (the DNS
    /// Service's endpoints) given as such; with those of the resolver pods the translation
    /// found ([`NodePolicy::dns_resolvers`]), only their answers teach domain rules, and only
    /// DNS to them is proxied.
    pub(crate) resolvers: Vec<ipnet::IpNet>,
}

impl DnsSteer {
    /// The steering to a proxy on `port`, marking with `mark`, trusting `resolvers`, with the
    /// default upstream marks ([`DNS_UPSTREAM_MARK`], [`DNS_PROXIED_MARK`]).
    pub fn new(port: u16, mark: u32, resolvers: Vec<ipnet::IpNet>) -> Self {
        Self { port, mark, upstream_mark: DNS_UPSTREAM_MARK, proxied_mark: DNS_PROXIED_MARK, resolvers }
    }
}

/// Choices of shape that do not change what is enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// An endpoint direction whose NetworkPolicy allow rules would take at least this many
    /// lookups one rule each goes through the peer classes instead ([`peers`]): a constant
    /// number of lookups per packet. Below it, one rule per allow rule and shared peer set is
    /// as fast per packet, and cheaper to change: every element of a class map is a `jump`,
    /// which the kernel re-validates in each transaction that adds one.
    pub peer_classes_from: usize,
    /// Denials logged to NFLOG ([`log`]), or only dropped.
    pub log: Option<log::DenyLog>,
    /// Connections whose ct mark has this bit (the agent revoked them: `crate::revoke`) are
    /// stopped first thing; `None`: no revocation.
    pub revoked: Option<u32>,
    /// Domain rules' DNS through the agent's proxy; `None`: no proxy (domain rules' sets stay
    /// empty: they admit nothing).
    pub dns: Option<DnsSteer>,
}

impl RenderOptions {
    pub const DEFAULT: Self =
        Self { peer_classes_from: PEER_CLASSES_FROM, log: Some(log::DenyLog::DEFAULT), revoked: Some(REVOKED_MARK), dns: None };
}

/// Lookups from which a pod's allow rules go through peer classes, by default.
pub(crate) const PEER_CLASSES_FROM: usize = 8;

impl Default for RenderOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Renders the node's table.
pub fn render(np: &NodePolicy) -> Ruleset {
    render_with(np, &RenderOptions::default())
}

/// [`render`] with a choice of shape.
pub fn render_with(np: &NodePolicy, options: &RenderOptions) -> Ruleset {
    RenderCache::new(options.clone()).render(np, &Changed { all: true, ..Changed::default() })
}

/// A rendered peer or named-port set, by definition and family.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum SetKey {
    Peer(PeerDef, Family),
    Port(NamedPortDef, Family),
    /// The set of a run of tier rules sharing one verdict ([`mergeable`]), by its rules' peers
    /// in order.
    Union(Vec<PeerDef>, Family),
}

/// One endpoint's chains of one direction as last rendered (enforced, audited), and the
/// sets they refer to.
struct EndpointRender {
    chains: Vec<Chain>,
    audit: Vec<Chain>,
    sets: Vec<SetKey>,
    /// The domain definitions its rules refer to (egress only), for the timed sets and the
    /// DNS steering: kept with the chains, so a render does not look at every rule again.
    domains: Vec<DomainDef>,
}

/// The last render's pieces, so the next one redoes only what the translation changed
/// ([`crate::translate::Changed`], from [`crate::translate::Incremental`]): the sets of
/// changed definitions, the chains of changed endpoints (and of those whose sets or peer
/// classes changed), the peer classes when an endpoint or set they depend on changed. The
/// rest — the dispatch maps and the address sets of the node's pods, a few elements per pod —
/// is written again every time. The output equals [`render_with`]'s (which is this with
/// everything changed); unchanged sets share their elements with the last render.
pub struct RenderCache {
    options: RenderOptions,
    sets: SetCache,
    /// How many endpoint chains (per endpoint and direction) refer to each set: the sets
    /// written are those referred to.
    uses: BTreeMap<SetKey, usize>,
    /// Ingress, egress.
    plans: Option<[PeerPlan; 2]>,
    endpoints: BTreeMap<(String, Direction), EndpointRender>,
    dispatch: Option<Dispatch>,
}

/// The elements of the pod address sets (IPv4, IPv6) and the dispatch maps (enforced, and
/// the audit mode's).
struct Dispatch {
    addrs: [Arc<Vec<Element>>; 2],
    nd_sources: Arc<Vec<Element>>,
    ingress: Arc<Vec<Element>>,
    egress: Arc<Vec<Element>>,
    audit_ingress: Arc<Vec<Element>>,
    audit_egress: Arc<Vec<Element>>,
}

/// Rendered peer and named-port sets per definition, per family (IPv4, IPv6): `None` not
/// rendered yet, `Some(None)` no address of the family (no set, no rule).
#[derive(Default)]
struct SetCache {
    peers: BTreeMap<PeerDef, [Option<Option<Set>>; 2]>,
    ports: BTreeMap<NamedPortDef, [Option<Option<Set>>; 2]>,
    unions: BTreeMap<Vec<PeerDef>, [Option<Option<Set>>; 2]>,
}

/// A full render's peer sets of both families, rendered up front and side by side
/// ([`par::map`]) when they hold many addresses; otherwise each is rendered when a rule first
/// names it. A set no rule names in its family is cached, not written (see
/// [`RenderCache::uses`]).
fn prerender_peer_sets(np: &NodePolicy, cache: &mut SetCache) {
    let jobs: Vec<(usize, &PeerDef)> = np.peer_sets.iter().map(|(d, s)| (s.v4.len() + s.v6.len(), d)).collect();
    if !par::worth_sharing(&jobs) {
        return;
    }
    let sets = par::map(&jobs, |d| [Family::V4, Family::V6].map(|fam| Renderer::new_peer_set(np, d, fam)));
    for ((_, def), [v4, v6]) in jobs.into_iter().zip(sets) {
        cache.peers.insert(def.clone(), [Some(v4), Some(v6)]);
    }
}

/// Renders the cached sets of the `changed` definitions again. A definition that is gone, or
/// whose set appeared or disappeared in a family (an empty set is not rendered), leaves the
/// cache and goes to `flipped`: the chains referring to it must be rendered again.
fn rerender<D: Ord + Clone>(
    cache: &mut BTreeMap<D, [Option<Option<Set>>; 2]>,
    changed: &BTreeSet<D>,
    present: impl Fn(&D) -> bool,
    render: impl Fn(&D, Family) -> Option<Set>,
    flipped: &mut BTreeSet<D>,
) {
    for def in changed {
        let Some(mut slots) = cache.remove(def) else { continue };
        let mut flip = !present(def);
        for fam in [Family::V4, Family::V6] {
            if let Some(old) = &mut slots[fam.index()] {
                let new = render(def, fam);
                flip |= old.is_some() != new.is_some();
                *old = new;
            }
        }
        if flip {
            flipped.insert(def.clone());
        } else {
            cache.insert(def.clone(), slots);
        }
    }
}

/// Renders again the cached sets of tier-rule runs that hold a changed peer set
/// ([`rerender`]); a run's set that appeared or disappeared in a family, or lost a peer,
/// flips its peers, so that the chains naming them are rendered again.
fn rerender_unions(
    unions: &mut BTreeMap<Vec<PeerDef>, [Option<Option<Set>>; 2]>,
    np: &NodePolicy,
    changed: &BTreeSet<PeerDef>,
    flipped: &mut BTreeSet<PeerDef>,
) {
    let hit: BTreeSet<Vec<PeerDef>> = unions.keys().filter(|defs| defs.iter().any(|d| changed.contains(d))).cloned().collect();
    let mut flipped_runs = BTreeSet::new();
    rerender(
        unions,
        &hit,
        |defs| defs.iter().all(|d| np.peer_sets.contains_key(d)),
        |defs, fam| Renderer::new_union_set(np, defs, fam),
        &mut flipped_runs,
    );
    flipped.extend(flipped_runs.into_iter().flatten());
}

impl SetCache {
    fn get(&self, key: &SetKey) -> Option<&Set> {
        match key {
            SetKey::Peer(d, fam) => self.peers.get(d).and_then(|f| f[fam.index()].as_ref()).and_then(Option::as_ref),
            SetKey::Port(d, fam) => self.ports.get(d).and_then(|f| f[fam.index()].as_ref()).and_then(Option::as_ref),
            SetKey::Union(d, fam) => self.unions.get(d).and_then(|f| f[fam.index()].as_ref()).and_then(Option::as_ref),
        }
    }
}

impl RenderCache {
    pub fn new(options: RenderOptions) -> Self {
        Self { options, sets: SetCache::default(), uses: BTreeMap::new(), plans: None, endpoints: BTreeMap::new(), dispatch: None }
    }

    /// The table for `np`, given what changed since the last call's `np` (on the first call,
    /// or after anything but that last `np`, pass [`Changed::all`]).
    pub fn render(&mut self, np: &NodePolicy, changed: &Changed) -> Ruleset {
        let classes_from = self.options.peer_classes_from;
        // Changed sets are rendered again now. A chain refers to a set by its name, which
        // does not depend on the content: only chains referring to a set that appeared or
        // disappeared in a family (an empty set's rule is left out) are rendered again.
        let mut flipped = Changed::default();
        if changed.all {
            self.sets = SetCache::default();
            self.uses.clear();
            self.endpoints.clear();
            self.plans = None;
            self.dispatch = None;
            prerender_peer_sets(np, &mut self.sets);
        } else {
            rerender(
                &mut self.sets.peers,
                &changed.peer_sets,
                |d| np.peer_sets.contains_key(d),
                |d, fam| Renderer::new_peer_set(np, d, fam),
                &mut flipped.peer_sets,
            );
            rerender(
                &mut self.sets.ports,
                &changed.port_sets,
                |d| np.port_sets.contains_key(d),
                |d, fam| Renderer::new_port_set(np, d, fam),
                &mut flipped.port_sets,
            );
            rerender_unions(&mut self.sets.unions, np, &changed.peer_sets, &mut flipped.peer_sets);
        }
        let mut replanned = [false; 2];
        let plans = match self.plans.take() {
            Some([ingress, egress]) => {
                let mut fresh = |plan: PeerPlan, i: usize, dir: Direction, allow: &Verdict| {
                    if plan.is_stale(np, changed, classes_from) {
                        replanned[i] = true;
                        PeerPlan::new(np, dir, allow, classes_from)
                    } else {
                        plan
                    }
                };
                [fresh(ingress, 0, Direction::Ingress, &Verdict::Accept), fresh(egress, 1, Direction::Egress, &goto(EGRESS_ALLOWED))]
            }
            None => {
                replanned = [true; 2];
                [
                    PeerPlan::new(np, Direction::Ingress, &Verdict::Accept, classes_from),
                    PeerPlan::new(np, Direction::Egress, &goto(EGRESS_ALLOWED), classes_from),
                ]
            }
        };
        let mut r =
            Renderer { np, plans: &plans, cache: &mut self.sets, used: Vec::new(), log: self.options.log, revoked: self.options.revoked };
        // Per endpoint, its chains in reference order, keyed by the entry's name.
        let (mut ingress_chains, mut egress_chains): (Vec<EndpointChains>, Vec<EndpointChains>) = (Vec::new(), Vec::new());
        let mut addrs = [Vec::new(), Vec::new()];
        let mut nd_sources = Vec::new();
        let (mut egress_map, mut ingress_map) = (Vec::new(), Vec::new());
        let mut endpoints = BTreeMap::new();
        let uses = &mut self.uses;
        let log_on = self.options.log.is_some();
        let mut chains_of = |r: &mut Renderer<'_>, ep: &EndpointPolicy, dir: Direction| -> Rendered {
            let key = (ep.interface.clone(), dir);
            let plan = &plans[usize::from(dir == Direction::Egress)];
            // A new peer plan only matters to the endpoints it covers.
            let plan_changed = replanned[usize::from(dir == Direction::Egress)] && plan.covers(&ep.interface);
            let reusable =
                !changed.all && !changed.endpoints.contains(&ep.interface) && !plan_changed && !refers_to_changed(ep, dir, &flipped);
            let rendered = match self.endpoints.remove(&key) {
                Some(cached) if reusable => cached,
                stale => {
                    if let Some(stale) = stale {
                        release(uses, &stale.sets);
                    }
                    r.used.clear();
                    let logs_allowed = log_on && ep.log_allowed;
                    let chains = if logs_allowed || ep.direction(dir).is_enforced() { r.endpoint_chains(ep, dir) } else { Vec::new() };
                    let audit = r.audit_chains(ep, dir).unwrap_or_default();
                    let mut sets = std::mem::take(&mut r.used);
                    sets.sort();
                    sets.dedup();
                    for k in &sets {
                        *uses.entry(k.clone()).or_default() += 1;
                    }
                    let domains = if dir == Direction::Egress { direction_domains(ep.direction(dir)) } else { Vec::new() };
                    EndpointRender { chains, audit, sets, domains }
                }
            };
            let out = Rendered {
                entry: rendered.chains.last().map(|c| c.name.clone()),
                audit_entry: rendered.audit.last().map(|c| c.name.clone()),
                chains: rendered.chains.iter().chain(&rendered.audit).cloned().collect(),
            };
            endpoints.insert(key, rendered);
            out
        };
        let audited = |d: &DirectionPolicy| log_on && d.audit.is_some();
        let logs_allowed = |ep: &EndpointPolicy| log_on && ep.log_allowed;
        let (mut audit_ingress_map, mut audit_egress_map) = (Vec::new(), Vec::new());

        // The dispatch maps and pod address sets change only with an endpoint (chain names do
        // not depend on the rules).
        let dispatch = self.dispatch.take().filter(|_| changed.endpoints.is_empty());
        for ep in &np.endpoints {
            let rendered = |d: &DirectionPolicy| d.is_enforced() || audited(d) || logs_allowed(ep);
            let egress = rendered(&ep.egress).then(|| chains_of(&mut r, ep, Direction::Egress));
            let ingress = rendered(&ep.ingress).then(|| chains_of(&mut r, ep, Direction::Ingress));
            if dispatch.is_none() {
                let pod = ep.pod.to_string();
                let iface = KeyPart::Ifname(ep.interface.clone());
                for ip in &ep.addrs {
                    let slot = usize::from(ip.is_ipv6());
                    addrs[slot].push(Element {
                        key: Key::new(vec![iface.clone(), KeyPart::Addr(*ip)]),
                        comment: comment(&pod),
                        verdict: None,
                    });
                }
                if ep.addrs.iter().any(std::net::IpAddr::is_ipv6) {
                    let own = ep.addrs.iter().copied().filter(std::net::IpAddr::is_ipv6);
                    let link_local = flock_cni::pod_link_local(&ep.interface);
                    for source in own.chain([link_local, std::net::Ipv6Addr::UNSPECIFIED].map(std::net::IpAddr::V6)) {
                        let key = Key::new(vec![iface.clone(), KeyPart::Addr(source)]);
                        nd_sources.push(Element { key, comment: comment(&pod), verdict: None });
                    }
                }
                let element = |verdict: Verdict| Element { key: Key::one(iface.clone()), comment: comment(&pod), verdict: Some(verdict) };
                if let Some(entry) = egress.as_ref().and_then(|e| e.entry.as_ref()) {
                    egress_map.push(element(Verdict::Jump(entry.clone())));
                }
                if let Some(entry) = egress.as_ref().and_then(|e| e.audit_entry.as_ref()) {
                    audit_egress_map.push(element(Verdict::Jump(entry.clone())));
                }
                if let Some(entry) = ingress.as_ref().and_then(|e| e.audit_entry.as_ref()) {
                    audit_ingress_map.push(element(Verdict::Goto(entry.clone())));
                }
                let verdict = ingress.as_ref().and_then(|e| e.entry.as_ref()).map_or(Verdict::Accept, |entry| Verdict::Goto(entry.clone()));
                ingress_map.push(element(verdict));
            }
            let keyed = |r: Rendered| (r.entry.or(r.audit_entry).unwrap_or_default(), r.chains);
            egress_chains.extend(egress.map(keyed));
            ingress_chains.extend(ingress.map(keyed));
        }
        drop(r);
        // Chains of endpoints that are gone (or no longer restricted in a direction).
        for gone in std::mem::replace(&mut self.endpoints, endpoints).into_values() {
            release(&mut self.uses, &gone.sets);
        }
        // A run's set lives as long as a chain refers to it (runs come and go with policies).
        let uses = &self.uses;
        self.sets.unions.retain(|defs, _| [Family::V4, Family::V6].iter().any(|f| uses.contains_key(&SetKey::Union(defs.clone(), *f))));

        let mut objects: Vec<Object> = Vec::new();
        let [ingress_plan, egress_plan] = &plans;
        // Class maps refer to class chains, which refer to sets: maps go with the chains.
        let mut sets: Vec<Set> = self.uses.keys().filter_map(|k| self.sets.get(k)).cloned().collect();
        sets.extend(ingress_plan.sets.iter().chain(&egress_plan.sets).cloned());
        let by_name = |v: &[Set]| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.name.cmp(&b.name));
            v.into_iter().map(Object::Set)
        };
        let class_chains = |v: &[Chain]| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.name.cmp(&b.name));
            v.into_iter().map(Object::Chain)
        };
        let dispatch = dispatch.unwrap_or_else(|| {
            let [v4, v6] = addrs;
            Dispatch {
                addrs: [v4, v6].map(|v| Arc::new(sorted(v))),
                nd_sources: Arc::new(sorted(nd_sources)),
                ingress: Arc::new(sorted(ingress_map)),
                egress: Arc::new(sorted(egress_map)),
                audit_ingress: Arc::new(sorted(audit_ingress_map)),
                audit_egress: Arc::new(sorted(audit_egress_map)),
            }
        });
        for (name, fam) in [(POD_ADDRS_V4, Family::V4), (POD_ADDRS_V6, Family::V6)] {
            sets.push(Set {
                name: name.into(),
                comment: format!(
                    "host interface and {} address of every pod on this node; other sources from a pod interface are dropped",
                    fam.as_str()
                ),
                key: vec!["ifname", addr_type(fam)],
                data: None,
                interval: false,
                timeout: false,
                limit: None,
                elements: Arc::clone(&dispatch.addrs[fam.index()]),
            });
        }
        sets.push(Set {
            name: POD_ND_SOURCES.into(),
            comment: "IPv6 pods' interfaces with their ND sources: flock-cni's link-local address, their own, ::; each rate-limited".into(),
            key: vec!["ifname", addr_type(Family::V6)],
            data: None,
            interval: false,
            timeout: false,
            limit: Some(ND_LIMIT),
            elements: Arc::clone(&dispatch.nd_sources),
        });
        let mut domains: BTreeMap<&DomainDef, BTreeSet<&str>> = BTreeMap::new();
        for ((iface, _), r) in &self.endpoints {
            for d in &r.domains {
                domains.entry(d).or_default().insert(iface.as_str());
            }
        }
        sets.extend(domain_sets(domains.keys().copied()));
        if let Some(dns) = &self.options.dns {
            sets.extend(dns_sets(dns, &np.dns_resolvers, domains.values().flatten().copied()));
        }
        if let Some(o) = &np.overlay {
            sets.extend(overlay_sets(o));
        }
        sets.sort_by(|a, b| a.name.cmp(&b.name));
        objects.extend(sets.into_iter().map(Object::Set));
        // Each object after those it refers to: ingress chains, their map, to-pods; then
        // egress-allowed (which goes to to-pods), egress chains, their map, from-pods, forward.
        let dns_mark = self.options.dns.as_ref().map(|d| d.mark);
        let ([mut from_pods, to_pods, forward, to_node, mut input], shared_denials) =
            skeleton(self.options.log, self.options.revoked, dns_mark);
        objects.extend(shared_denials.into_iter().map(Object::Chain));
        if let Some(o) = &np.overlay {
            let spoofed = if self.options.log.is_some() { goto(DENY_SPOOFED) } else { Verdict::Drop };
            Arc::make_mut(&mut input.rules).insert(0, overlay_guard(o));
            objects.push(Object::Chain(overlay_in(&spoofed)));
            // After the source check, before the egress policy (and before any SNAT could
            // give a pod's packet a node's address).
            Arc::make_mut(&mut from_pods.rules).splice(2..2, overlay_from_pods(o, &spoofed));
        }
        let flatten = |mut v: Vec<EndpointChains>| {
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v.into_iter().flat_map(|(_, c)| c).map(Object::Chain).collect::<Vec<_>>()
        };
        objects.extend(class_chains(&ingress_plan.chains));
        objects.extend(by_name(&ingress_plan.maps));
        objects.extend(flatten(ingress_chains));
        objects.push(Object::Set(Set {
            name: INGRESS_MAP.into(),
            comment: "pod interface -> its ingress policy chain, or accept when nothing restricts it".into(),
            key: vec!["ifname"],
            data: Some("verdict"),
            interval: false,
            timeout: false,
            limit: None,
            elements: Arc::clone(&dispatch.ingress),
        }));
        // Audit mode: its dispatch, where some endpoint has an audited view.
        let auditing = !dispatch.audit_ingress.is_empty() || !dispatch.audit_egress.is_empty();
        let audit_map = |name: &str, comment: &str, elements: &Arc<Vec<Element>>| {
            Object::Set(Set {
                name: name.into(),
                comment: comment.into(),
                key: vec!["ifname"],
                data: Some("verdict"),
                interval: false,
                timeout: false,
                limit: None,
                elements: Arc::clone(elements),
            })
        };
        if auditing {
            objects.push(audit_map(
                AUDIT_INGRESS_MAP,
                "audit mode: pod interface -> the ingress policy its audited policies would give",
                &dispatch.audit_ingress,
            ));
        }
        objects.push(Object::Chain(to_pods));
        if auditing {
            objects.push(Object::Chain(Chain {
                name: AUDIT_TO_PODS.into(),
                comment: "audit mode: packets to a pod on this node, through its audited ingress policy".into(),
                hook: None,
                rules: Arc::new(vec![vmap(Field::OifName, AUDIT_INGRESS_MAP), Rule::verdict(Verdict::Accept)]),
            }));
        }
        objects.push(Object::Chain(egress_allowed()));
        if auditing {
            objects.push(Object::Chain(Chain {
                name: AUDIT_EGRESS_ALLOWED.into(),
                comment: "audit mode: egress the audited policies would allow; then the destination's audited ingress".into(),
                hook: None,
                rules: Arc::new(vec![pod_interfaces(true, goto(AUDIT_TO_PODS)), Rule::verdict(Verdict::Accept)]),
            }));
        }
        objects.extend(class_chains(&egress_plan.chains));
        objects.extend(by_name(&egress_plan.maps));
        objects.extend(flatten(egress_chains));
        objects.push(Object::Set(Set {
            name: EGRESS_MAP.into(),
            comment: "pod interface -> its egress policy chain (pods whose egress something restricts)".into(),
            key: vec!["ifname"],
            data: Some("verdict"),
            interval: false,
            timeout: false,
            limit: None,
            elements: Arc::clone(&dispatch.egress),
        }));
        if auditing {
            objects.push(audit_map(
                AUDIT_EGRESS_MAP,
                "audit mode: pod interface -> the egress policy its audited policies would give",
                &dispatch.audit_egress,
            ));
        }
        objects.push(Object::Chain(from_pods));
        objects.push(Object::Chain(forward));
        objects.push(Object::Chain(to_node));
        objects.push(Object::Chain(input));
        if auditing {
            objects.push(Object::Chain(Chain {
                name: AUDIT_FROM_PODS.into(),
                comment:
                    "audit mode: packets from a pod on this node, through its audited egress policy (spoofed ones are left to forward)"
                        .into(),
                hook: None,
                rules: Arc::new(vec![
                    Rule::new(vec![spoofed(Family::V4)], Some(Verdict::Accept)),
                    Rule::new(vec![spoofed(Family::V6)], Some(Verdict::Accept)),
                    vmap(Field::IifName, AUDIT_EGRESS_MAP),
                ]),
            }));
            objects.push(Object::Chain(Chain {
                name: AUDIT_BASE_CHAIN.into(),
                comment: "audit mode, before forward: what audited policies would deny is logged and accepted; forward decides".into(),
                hook: Some(Hook { type_: "filter", hook: "forward", priority: "filter - 1", policy: "accept" }),
                rules: Arc::new(vec![
                    established(),
                    pod_interfaces(false, Verdict::Jump(AUDIT_FROM_PODS.into())),
                    pod_interfaces(true, goto(AUDIT_TO_PODS)),
                ]),
            }));
            let mut rules = vec![established()];
            rules.extend(link_local());
            rules.extend(steered_dns(dns_mark));
            rules.push(pod_interfaces(false, goto(AUDIT_FROM_PODS)));
            objects.push(Object::Chain(Chain {
                name: AUDIT_INPUT_CHAIN.into(),
                comment: "audit mode, before input: what audited policies would deny of pods' packets to this node is logged and accepted; input decides"
                    .into(),
                hook: Some(Hook { type_: "filter", hook: "input", priority: "filter - 1", policy: "accept" }),
                rules: rules.into(),
            }));
        }
        if let Some(dns) = &self.options.dns {
            objects.extend(dns_chains(dns).into_iter().map(Object::Chain));
        }
        self.plans = Some(plans);
        self.dispatch = Some(dispatch);
        Ruleset { comment: TABLE_COMMENT.into(), objects }
    }
}

/// Where a domain definition is used on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainUse {
    /// The addresses of the local pods whose egress has a rule with it.
    pub(crate) pods: BTreeSet<std::net::IpAddr>,
    /// Their host-side interfaces.
    pub(crate) interfaces: BTreeSet<String>,
    /// The rules it comes from (`policy egress[i]`), for logs and comments.
    pub(crate) sources: BTreeSet<String>,
}

/// The domain definitions a direction's rules refer to (enforced or audited), sorted.
fn direction_domains(d: &DirectionPolicy) -> Vec<DomainDef> {
    let mut out: Vec<DomainDef> =
        d.peers().into_iter().filter_map(|m| if let PeerMatch::Domains(def) = m { Some(def.clone()) } else { None }).collect();
    out.sort();
    out.dedup();
    out
}

/// Every domain definition the egress of this node's pods refers to (enforced or audited).
pub fn domain_uses(np: &NodePolicy) -> BTreeMap<&DomainDef, DomainUse> {
    fn visit<'a>(d: &'a DirectionPolicy, ep: &EndpointPolicy, out: &mut BTreeMap<&'a DomainDef, DomainUse>) {
        let mut note = |def: &'a DomainDef, source: String| {
            let u = out.entry(def).or_default();
            u.pods.extend(ep.addrs.iter().copied());
            u.interfaces.insert(ep.interface.clone());
            u.sources.insert(source);
        };
        for r in &d.rules {
            if let PeerMatch::Domains(def) = &r.peer {
                for o in &r.origins {
                    note(def, o.to_string());
                }
            }
        }
        for r in d.admin.iter().chain(&d.baseline).flat_map(|g| &g.policies).flat_map(|p| &p.rules) {
            if let PeerMatch::Domains(def) = &r.peer {
                note(def, r.origin.to_string());
            }
        }
        if let Some(a) = &d.audit {
            visit(a, ep, out);
        }
    }
    let mut out = BTreeMap::new();
    for ep in &np.endpoints {
        visit(&ep.egress, ep, &mut out);
    }
    out
}

/// The timed set of a domain definition in one family (IPv6 when `v6`): named after its
/// patterns, so the proxy's learner and every render agree on it.
pub fn domain_set_name(def: &DomainDef, v6: bool) -> String {
    let fam = if v6 { Family::V6 } else { Family::V4 };
    names::dynamic(&format!("domains-{}", fam.tag()), &[&def.short()], &def.short())
}

/// The timed sets of the domain definitions in use, both families, always empty here (their
/// elements are the proxy's).
fn domain_sets<'a>(domains: impl Iterator<Item = &'a DomainDef>) -> Vec<Set> {
    let mut out = Vec::new();
    for def in domains {
        for fam in [Family::V4, Family::V6] {
            out.push(Set {
                name: domain_set_name(def, fam == Family::V6),
                comment: comment(&format!("{} addresses learned for {def}, each until its TTL; written by the DNS proxy", fam.as_str())),
                key: vec![addr_type(fam)],
                data: None,
                interval: false,
                timeout: true,
                limit: None,
                elements: Arc::new(Vec::new()),
            });
        }
    }
    out
}

/// The overlay's senders, per family ([`OverlayGuard`]).
pub const OVERLAY_NODES_V4: &str = "overlay-nodes-v4";
pub const OVERLAY_NODES_V6: &str = "overlay-nodes-v6";
/// The chain every VXLAN packet to this node goes through first ([`overlay_in`]).
pub const OVERLAY_IN: &str = "overlay-in";
/// The addresses this node's VXLAN devices receive on, per family.
pub const OVERLAY_LOCAL_V4: &str = "overlay-local-v4";
pub const OVERLAY_LOCAL_V6: &str = "overlay-local-v6";
/// Every node's pod CIDRs, per family: the only destinations of a pod's UDP to the VXLAN port.
pub const OVERLAY_POD_CIDRS_V4: &str = "overlay-pod-cidrs-v4";
pub const OVERLAY_POD_CIDRS_V6: &str = "overlay-pod-cidrs-v6";

/// The families, as (outer, inner), of the sets of what each node's VXLAN may carry.
const OVERLAY_PAIRS: [(Family, Family); 4] =
    [(Family::V4, Family::V4), (Family::V4, Family::V6), (Family::V6, Family::V4), (Family::V6, Family::V6)];

/// The set of a node's underlay address . an inner source it may send, for an (outer, inner)
/// pair of families.
fn overlay_sources_set(outer: Family, inner: Family) -> String {
    let v = |f: Family| if f == Family::V6 { "v6" } else { "v4" };
    format!("overlay-{}-in-{}", v(inner), v(outer))
}

fn overlay_sets(o: &crate::translate::OverlayGuard) -> Vec<Set> {
    let of_family = |fam: Family| move |a: &&std::net::IpAddr| a.is_ipv6() == (fam == Family::V6);
    let mut out: Vec<Set> = Vec::new();
    for (fam, local, cidrs) in [(Family::V4, OVERLAY_LOCAL_V4, OVERLAY_POD_CIDRS_V4), (Family::V6, OVERLAY_LOCAL_V6, OVERLAY_POD_CIDRS_V6)]
    {
        out.push(Set {
            name: local.into(),
            comment: format!(
                "this node's {} address its VXLAN device receives on: VXLAN to another address of the node is dropped",
                fam.as_str()
            ),
            key: vec![addr_type(fam)],
            data: None,
            interval: false,
            timeout: false,
            limit: None,
            elements: Arc::new(sorted(
                o.local
                    .iter()
                    .filter(of_family(fam))
                    .map(|a| element_of(Key::one(KeyPart::Addr(*a)), "this node's VXLAN device"))
                    .collect(),
            )),
        });
        out.push(Set {
            name: cidrs.into(),
            comment: format!("every node's {} pod CIDRs: a pod's UDP {} to any other address is dropped", fam.as_str(), o.port),
            key: vec![addr_type(fam)],
            data: None,
            interval: true,
            timeout: false,
            limit: None,
            elements: Arc::new(sorted(
                o.pod_cidrs
                    .iter()
                    .filter(|n| n.addr().is_ipv6() == (fam == Family::V6))
                    .map(|n| element_of(Key::one(KeyPart::Net(*n)), "pod CIDR"))
                    .collect(),
            )),
        });
    }
    out.extend([(Family::V4, OVERLAY_NODES_V4), (Family::V6, OVERLAY_NODES_V6)].into_iter().map(|(fam, name)| {
        Set {
            name: name.into(),
            comment: format!("every {} address of the nodes: a pod's VXLAN (UDP {}) to one is dropped", fam.as_str(), o.port),
            key: vec![addr_type(fam)],
            data: None,
            interval: false,
            timeout: false,
            limit: None,
            elements: Arc::new(sorted(
                o.nodes
                    .iter()
                    .filter(|a| a.is_ipv6() == (fam == Family::V6))
                    .map(|a| element_of(Key::one(KeyPart::Addr(*a)), "node"))
                    .collect(),
            )),
        }
    }));
    for (outer, inner) in OVERLAY_PAIRS {
        let mut elements = Vec::new();
        for s in &o.senders {
            for u in s.underlay.iter().filter(|a| a.is_ipv6() == (outer == Family::V6)) {
                for n in s.inner.iter().filter(|n| n.addr().is_ipv6() == (inner == Family::V6)) {
                    let what = if n.prefix_len() == n.max_prefix_len() && s.underlay.contains(&n.addr()) {
                        format!("{}: its address {}", s.node, n.addr())
                    } else {
                        format!("{}: pods {n}", s.node)
                    };
                    elements.push(element_of(Key::new(vec![KeyPart::Addr(*u), KeyPart::Raw(*n)]), &what));
                }
            }
        }
        out.push(Set {
            name: overlay_sources_set(outer, inner),
            comment: format!(
                "node {} address . {} source inside its VXLAN: its pod CIDRs and its own addresses",
                outer.as_str(),
                inner.as_str()
            ),
            key: [Field::Saddr(outer), Field::InnerSaddr(inner)].into_iter().filter_map(Field::typeof_part).collect(),
            data: None,
            interval: true,
            timeout: false,
            limit: None,
            elements: Arc::new(sorted(elements)),
        });
    }
    out
}

/// The input chain's first rule under an overlay: VXLAN to this node goes through
/// [`overlay_in`].
fn overlay_guard(o: &crate::translate::OverlayGuard) -> Rule {
    Rule::new(vec![Stmt::Dport(Proto::Udp, Ports::One(o.port))], Some(Verdict::Jump(OVERLAY_IN.into())))
        .comment("VXLAN to this node: checked for its sender and what it carries")
}

/// What a VXLAN packet to this node must be: to the address its VXLAN device receives on
/// (the kernel decapsulates VXLAN to any address the node holds: a second NIC's, a VIP), from
/// a node, carrying an IPv4 or IPv6 packet whose source is one of that node's pods or
/// addresses. Anything else — to another address, from a host that is not a node, a forged
/// inner source, another EtherType, a frame too short to read — is dropped as spoofed (a raw
/// field that cannot be read matches nothing).
fn overlay_in(spoofed: &Verdict) -> Chain {
    let mut rules: Vec<Rule> = [(Family::V4, OVERLAY_LOCAL_V4), (Family::V6, OVERLAY_LOCAL_V6)]
        .into_iter()
        .map(|(fam, set)| {
            Rule::new(
                vec![Stmt::Lookup { fields: vec![Field::Daddr(fam)], neg: true, set: set.into() }, Stmt::Counter],
                Some(spoofed.clone()),
            )
            .comment("VXLAN to an address of this node its VXLAN device does not receive on: not the overlay")
        })
        .collect();
    rules.extend(OVERLAY_PAIRS.into_iter().map(|(outer, inner)| {
        Rule::new(
            vec![
                Stmt::InnerEtherType(inner),
                Stmt::Lookup {
                    fields: vec![Field::Saddr(outer), Field::InnerSaddr(inner)],
                    neg: false,
                    set: overlay_sources_set(outer, inner),
                },
            ],
            Some(Verdict::Return),
        )
    }));
    rules.push(
        Rule::new(vec![Stmt::Counter], Some(spoofed.clone()))
            .comment("VXLAN not from a node, or carrying a source that is not the sending node's: spoofed"),
    );
    Chain {
        name: OVERLAY_IN.into(),
        comment: "VXLAN to this node: a node's frames carrying its own pods' or addresses' packets return to input".into(),
        hook: None,
        rules: rules.into(),
    }
}

/// In `from-pods` under an overlay: a pod's UDP to the VXLAN port is dropped as spoofed,
/// whatever its policy, when it goes to any address of a node or to any address outside the
/// nodes' pod CIDRs (masqueraded on its way, it would leave with a node's address and reach
/// `overlay-in` as its node's frame — at an address the Node objects list or any other the
/// receiving node holds). Pod to pod on that port is left to policy.
fn overlay_from_pods(o: &crate::translate::OverlayGuard, spoofed: &Verdict) -> Vec<Rule> {
    let mut out: Vec<Rule> = [(Family::V4, OVERLAY_NODES_V4), (Family::V6, OVERLAY_NODES_V6)]
        .into_iter()
        .map(|(fam, set)| {
            Rule::new(
                vec![
                    Stmt::Lookup { fields: vec![Field::Daddr(fam)], neg: false, set: set.into() },
                    Stmt::Dport(Proto::Udp, Ports::One(o.port)),
                    Stmt::Counter,
                ],
                Some(spoofed.clone()),
            )
            .comment("VXLAN from a pod to a node: only nodes send the overlay")
        })
        .collect();
    out.extend([(Family::V4, OVERLAY_POD_CIDRS_V4), (Family::V6, OVERLAY_POD_CIDRS_V6)].into_iter().map(|(fam, set)| {
        Rule::new(
            vec![
                Stmt::Lookup { fields: vec![Field::Daddr(fam)], neg: true, set: set.into() },
                Stmt::Dport(Proto::Udp, Ports::One(o.port)),
                Stmt::Counter,
            ],
            Some(spoofed.clone()),
        )
        .comment("VXLAN from a pod to an address that is not a pod's: only nodes send the overlay")
    }));
    out
}

/// The pod interfaces whose DNS goes through the proxy, and the trusted resolvers.
fn dns_sets<'a>(dns: &DnsSteer, selected: &[std::net::IpAddr], interfaces: impl Iterator<Item = &'a str>) -> Vec<Set> {
    let interfaces: BTreeSet<&str> = interfaces.collect();
    let proxied: Vec<Element> =
        interfaces.into_iter().map(|i| element_of(Key::one(KeyPart::Ifname(i.to_string())), "egress by domain name")).collect();
    let mut out = vec![Set {
        name: DNS_PROXIED.into(),
        comment: "pod interfaces with domain rules: their DNS to trusted resolvers goes through the DNS proxy".into(),
        key: vec!["ifname"],
        data: None,
        interval: false,
        timeout: false,
        limit: None,
        elements: Arc::new(sorted(proxied)),
    }];
    for fam in [Family::V4, Family::V6] {
        let nets: BTreeSet<ipnet::IpNet> = dns
            .resolvers
            .iter()
            .copied()
            .chain(selected.iter().map(|a| ipnet::IpNet::from(*a)))
            .filter(|n| n.addr().is_ipv6() == (fam == Family::V6))
            .map(|n| n.trunc())
            .collect();
        out.push(Set {
            name: if fam == Family::V6 { DNS_RESOLVERS_V6 } else { DNS_RESOLVERS_V4 }.into(),
            comment: format!("trusted DNS resolvers ({}): their answers teach domain rules", fam.as_str()),
            key: vec![addr_type(fam)],
            data: None,
            interval: true,
            timeout: false,
            limit: None,
            elements: Arc::new(interval_elements(&nets, "trusted resolver")),
        });
    }
    out
}

/// CIDRs as an interval set's elements, overlaps merged away (a prefix inside another is
/// dropped), in address order.
fn interval_elements(nets: &BTreeSet<ipnet::IpNet>, what: &str) -> Vec<Element> {
    let mut kept: Vec<ipnet::IpNet> = Vec::new();
    for n in nets {
        if !kept.iter().any(|k| k.contains(n)) {
            kept.retain(|k| !n.contains(k));
            kept.push(*n);
        }
    }
    kept.sort();
    kept.iter().map(|n| element_of(Key::one(KeyPart::Net(*n)), what)).collect()
}

/// The DNS steering base chains (see [`DnsSteer`]), after `from-pods` and `to-pods`, which
/// they jump to.
fn dns_chains(dns: &DnsSteer) -> [Chain; 3] {
    let (bit, up, proxied) = (dns.mark, dns.upstream_mark, dns.proxied_mark);
    // One rule per family and protocol (no anonymous sets: the netlink writer encodes them).
    let steer = |fam: Family, set: &str, proto: Proto| {
        Rule::new(
            vec![
                Stmt::Lookup { fields: vec![Field::IifName], neg: false, set: DNS_PROXIED.into() },
                Stmt::Lookup { fields: vec![Field::Daddr(fam)], neg: false, set: set.into() },
                Stmt::Dport(proto, Ports::One(53)),
                Stmt::SetMarkBit { ct: false, bit },
            ],
            Some(Verdict::Jump(FROM_PODS.into())),
        )
        .comment("DNS of a pod with domain rules: its egress policy decides, then the proxy")
    };
    let answer = || vec![Stmt::CtReply(true), Stmt::MarkBit { ct: true, bit: proxied }];
    let mut proxy = Vec::new();
    for (fam, addrs) in [(Family::V4, POD_ADDRS_V4), (Family::V6, POD_ADDRS_V6)] {
        let mut stmts = answer();
        stmts.push(Stmt::Lookup { fields: vec![Field::IifName, Field::Saddr(fam)], neg: false, set: addrs.into() });
        stmts.push(Stmt::SetMarkBit { ct: false, bit });
        proxy.push(
            Rule::new(stmts, Some(Verdict::Accept))
                .comment("an answer to the DNS proxy's query from a resolver pod of this node: to the proxy"),
        );
    }
    let mut stmts = answer();
    stmts.extend([Stmt::IfName { out: false, neg: false, name: POD_INTERFACES.into() }, Stmt::Counter]);
    proxy.push(Rule::new(stmts, Some(Verdict::Drop)).comment("a forged answer to the DNS proxy's query, from a pod interface"));
    let mut stmts = answer();
    stmts.push(Stmt::SetMarkBit { ct: false, bit });
    proxy.push(
        Rule::new(stmts, Some(Verdict::Accept)).comment("an answer to the DNS proxy's query (sent as the pod): to the proxy, not the pod"),
    );
    for listener in [std::net::IpAddr::from([127, 0, 0, 1]), std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)] {
        for proto in [Proto::Udp, Proto::Tcp] {
            proxy.push(
                Rule::new(
                    vec![Stmt::MarkBit { ct: false, bit }, Stmt::L4Proto(proto), Stmt::Tproxy { addr: Some(listener), port: dns.port }],
                    Some(Verdict::Accept),
                )
                .comment("to the DNS proxy"),
            );
        }
    }
    proxy.push(
        Rule::new(vec![Stmt::MarkBit { ct: false, bit }, Stmt::Counter], Some(Verdict::Drop))
            .comment("the DNS proxy is not listening: dropped (fail closed)"),
    );
    [
        Chain {
            name: DNS_STEER_CHAIN.into(),
            comment:
                "DNS of pods with domain rules, after DNAT: judged by the pod's egress policy (from-pods), marked for the proxy if allowed"
                    .into(),
            hook: Some(Hook { type_: "filter", hook: "prerouting", priority: "dstnat + 10", policy: "accept" }),
            rules: Arc::new(vec![
                steer(Family::V4, DNS_RESOLVERS_V4, Proto::Udp),
                steer(Family::V4, DNS_RESOLVERS_V4, Proto::Tcp),
                steer(Family::V6, DNS_RESOLVERS_V6, Proto::Udp),
                steer(Family::V6, DNS_RESOLVERS_V6, Proto::Tcp),
            ]),
        },
        Chain {
            name: DNS_PROXY_CHAIN.into(),
            comment: "steered DNS to flock-agent's DNS proxy (dropped without it), and answers to the proxy's queries back to it".into(),
            hook: Some(Hook { type_: "filter", hook: "prerouting", priority: "-80", policy: "accept" }),
            rules: proxy.into(),
        },
        Chain {
            name: DNS_UPSTREAM_CHAIN.into(),
            comment:
                "the DNS proxy's queries, sent as the pod: marked for their answers; to a local resolver pod through its ingress policy"
                    .into(),
            hook: Some(Hook { type_: "filter", hook: "output", priority: "mangle", policy: "accept" }),
            rules: Arc::new(vec![
                Rule::new(vec![Stmt::MarkBit { ct: false, bit: up }, Stmt::SetMarkBit { ct: true, bit: proxied }], None)
                    .comment("the DNS proxy's query: its answer goes to the proxy"),
                Rule::new(
                    vec![Stmt::MarkBit { ct: false, bit: up }, Stmt::IfName { out: true, neg: false, name: POD_INTERFACES.into() }],
                    Some(goto(TO_PODS)),
                )
                .comment("to a resolver pod of this node: its ingress policy decides, as for the pod's own query"),
            ]),
        },
    ]
}

/// One endpoint chain's sets no longer referred to by it.
fn release(uses: &mut BTreeMap<SetKey, usize>, sets: &[SetKey]) {
    for k in sets {
        if let Some(n) = uses.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                uses.remove(k);
            }
        }
    }
}

/// The peer set of a tier rule that may share one set with its neighbours: an exact set (pods
/// or nodes), not an ipBlock's ranges nor every pod's set, which holds the pod CIDRs (the
/// union of interval sets would have to merge their overlaps).
fn mergeable(peer: &PeerMatch) -> Option<&PeerDef> {
    match peer {
        PeerMatch::Addresses(def) if !matches!(def, PeerDef::Block(_)) && !crate::translate::PodRanges::serve(def) => Some(def),
        _ => None,
    }
}

/// `stmts`, counted (with `counted`), then `verdict`, commented `note`.
fn verdict_rule(mut stmts: Vec<Stmt>, counted: bool, verdict: &Verdict, note: &str) -> Rule {
    if counted {
        stmts.push(Stmt::Counter);
    }
    Rule::new(stmts, Some(verdict.clone())).comment(note)
}

/// The address a peer is matched on: the source of what comes in, the destination of what
/// goes out.
fn peer_field(dir: Direction, fam: Family) -> Field {
    match dir {
        Direction::Ingress => Field::Saddr(fam),
        Direction::Egress => Field::Daddr(fam),
    }
}

/// Whether a rule of `ep` in `dir` refers to a set that changed (its rules may differ: a rule
/// whose set has no address of a family is left out).
fn refers_to_changed(ep: &EndpointPolicy, dir: Direction, changed: &Changed) -> bool {
    if changed.peer_sets.is_empty() && changed.port_sets.is_empty() {
        return false;
    }
    let hit = |m: &PeerMatch| match m {
        PeerMatch::Any | PeerMatch::Domains(_) => false,
        PeerMatch::Addresses(d) => changed.peer_sets.contains(d),
        PeerMatch::NamedPort(d) => changed.port_sets.contains(d),
    };
    ep.direction(dir).peers().into_iter().any(hit)
}

/// Where an egress policy sends what it allows: a packet to a pod on this node meets that
/// pod's ingress policy (`to-pods`), any other is accepted.
fn egress_allowed() -> Chain {
    Chain {
        name: EGRESS_ALLOWED.into(),
        comment: "egress allowed by the source pod's policy: the destination's ingress policy decides (pods of this node), else accept"
            .into(),
        hook: None,
        rules: Arc::new(vec![pod_interfaces(true, goto(TO_PODS)), Rule::verdict(Verdict::Accept)]),
    }
}

/// `goto chain`
fn goto(chain: &str) -> Verdict {
    Verdict::Goto(chain.into())
}

/// `ct state established,related accept`
fn established() -> Rule {
    Rule::new(vec![Stmt::CtState(vec![CtState::Established, CtState::Related])], Some(Verdict::Accept))
}

/// `iifname "flk*" VERDICT` (from a pod interface), `oifname "flk*" VERDICT` (`out`: to one).
fn pod_interfaces(out: bool, v: Verdict) -> Rule {
    Rule::new(vec![Stmt::IfName { out, neg: false, name: POD_INTERFACES.into() }], Some(v))
}

/// `iifname vmap @MAP`, `oifname vmap @MAP`.
fn vmap(field: Field, map: &str) -> Rule {
    Rule::new(vec![Stmt::Vmap { fields: vec![field], map: map.into() }], None)
}

/// `iifname . ip saddr != @pod-addrs-v4`: an unknown pod interface or a spoofed source.
fn spoofed(fam: Family) -> Stmt {
    let set = if fam == Family::V4 { POD_ADDRS_V4 } else { POD_ADDRS_V6 };
    Stmt::Lookup { fields: vec![Field::IifName, Field::Saddr(fam)], neg: true, set: set.into() }
}

fn sorted(mut v: Vec<Element>) -> Vec<Element> {
    element::sort_as_written(&mut v);
    v.dedup_by(|a, b| a.key == b.key);
    v
}

/// The chains where packets from spoofed sources and to unknown pod interfaces are logged
/// (rate-limited) and dropped.
pub(crate) const DENY_SPOOFED: &str = "deny-spoofed";
pub(crate) const DENY_UNKNOWN_POD: &str = "deny-unknown-pod";
/// Where packets of revoked connections go: logged (with logging), a TCP one answered with a
/// reset, dropped.
pub(crate) const REVOKED: &str = "revoked";

/// The ct mark bit flock sets on connections it revoked, by default (`crate::revoke`).
pub const REVOKED_MARK: u32 = 0x0100_0000;

/// The base chain's first rule with revocation: a connection the agent marked (`bit` of its
/// ct mark) because the policy in force denies it goes no further, whatever its state.
pub(crate) fn revoked_rule(bit: u32) -> Rule {
    Rule::new(vec![Stmt::MarkBit { ct: true, bit }, Stmt::Counter], Some(goto(REVOKED)))
        .comment("connection revoked: the policy in force denies it")
}

/// What a pod sends the node to find its gateway and take part in multicast on its link,
/// which no policy judges: IPv6 neighbour discovery and multicast listener reports, before
/// the invalid check in the chains of packets to the node (conntrack may call them invalid).
/// Only as RFC 4861 and 3810 send them — neighbour discovery with hop limit 255 (a packet that
/// crossed a router has less), MLD with hop limit 1 — and only from the pod's own sources on
/// its own interface ([`POD_ND_SOURCES`]): the link-local address flock-cni gives it, its own
/// addresses (Linux solicits from the address of the packet that needs the neighbour) and
/// `::` (duplicate address detection, before the pod has an address), each within its own
/// rate ([`ND_LIMIT`]). Anything else of these types — a forged global or link-local source,
/// a flood past the rate — goes on to the source check, which drops it as spoofed: a pod
/// cannot make the node learn a neighbour entry for an address not its own, nor keep the
/// node's neighbour discovery busy.
fn link_local() -> Vec<Rule> {
    let mut out = vec![router_solicitations()];
    for t in ICMPV6_LINK {
        let (hop_limit, what) = match t {
            IcmpV6::MldListenerReport | IcmpV6::Mld2ListenerReport => (1, "multicast listener report"),
            _ => (255, "neighbour discovery"),
        };
        out.push(
            Rule::new(
                vec![
                    Stmt::IcmpV6Type(t),
                    Stmt::HopLimit(hop_limit),
                    Stmt::Lookup { fields: vec![Field::IifName, Field::Saddr(Family::V6)], neg: false, set: POD_ND_SOURCES.into() },
                ],
                Some(Verdict::Accept),
            )
            .comment(format!("IPv6 {what} from the pod's own sources, hop limit {hop_limit}, within their rate: never policy")),
        );
        // Past the rate, from the pod's own address (which the source check passes): dropped
        // here, not judged by policy. From any other source the source check drops it.
        out.push(
            Rule::new(
                vec![
                    Stmt::IcmpV6Type(t),
                    Stmt::Lookup { fields: vec![Field::IifName, Field::Saddr(Family::V6)], neg: false, set: POD_ADDRS_V6.into() },
                    Stmt::Counter,
                ],
                Some(Verdict::Drop),
            )
            .comment(format!("IPv6 {what} from the pod's own address past its rate or hop limit: dropped")),
        );
    }
    out
}

/// Router solicitations from a pod, dropped (counted, not logged): its routes come from
/// flock-cni and no router advertises to it, while a node that forwards records the source
/// of each solicitation as a neighbour entry (on an interface with ARP off too), so a pod
/// could fill the node's table with forged link-local ones. Not logged: every pod's kernel
/// sends them as its interface comes up, which is no denial.
fn router_solicitations() -> Rule {
    Rule::new(vec![Stmt::IcmpV6Type(IcmpV6::NdRouterSolicit), Stmt::Counter], Some(Verdict::Drop))
        .comment("IPv6 router solicitation: no router answers pods; dropped, not logged")
}

/// With the DNS proxy: DNS the steering already judged (`dns-steer` jumps `from-pods`) and
/// marked for the proxy, accepted rather than judged again.
fn steered_dns(dns_mark: Option<u32>) -> Option<Rule> {
    Some(
        Rule::new(vec![Stmt::MarkBit { ct: false, bit: dns_mark? }], Some(Verdict::Accept))
            .comment("DNS steered to the proxy: judged by the pod's egress policy in dns-steer"),
    )
}

/// The ICMPv6 types a pod sends to its gateway (the host side of its interface) to find it
/// and to take part in multicast on the link: neighbour discovery (RFC 4861) and MLD. Not
/// router solicitations: see [`router_solicitations`].
const ICMPV6_LINK: [IcmpV6; 4] =
    [IcmpV6::NdNeighborSolicit, IcmpV6::NdNeighborAdvert, IcmpV6::MldListenerReport, IcmpV6::Mld2ListenerReport];

/// The static chains: dispatch (from-pods, to-pods), the forward base chain, the input base
/// chain and the chain it sends local pods' packets to (to-node); and the chains where what
/// they deny goes (logged, with logging; and revoked connections).
///
/// A pod's packet to an address of the node itself is not forwarded: hook `input` sees it.
/// `to-node` judges it as `forward` judges a forwarded one — revoked connections stopped,
/// established ones accepted, invalid ones dropped, the source checked and the pod's egress
/// policy applied
/// (`from-pods`; what it allows ends in `egress-allowed`, whose `accept` is final here, as
/// no pod is behind it) — so a pod under egress deny-all reaches nothing on its node. Only
/// what pods send to find their gateway ([`link_local`]), and DNS the steering judged
/// already ([`steered_dns`]), is taken before. Packets *from* the node to its pods (kubelet probes) leave
/// through hook `output` and are not policed (the documented limit); their replies are
/// established here.
fn skeleton(log: Option<log::DenyLog>, revoked: Option<u32>, dns_mark: Option<u32>) -> ([Chain; 5], Vec<Chain>) {
    let (spoofed_verdict, unknown, mut shared) = match log {
        Some(log) => {
            let chain = |name: &str, what: &str, prefix: log::LogPrefix| {
                log.chain(
                    name.into(),
                    comment(&format!("{what}: {}", log.describe("dropped"))),
                    &prefix,
                    vec![Rule::verdict(Verdict::Drop)],
                )
            };
            (
                goto(DENY_SPOOFED),
                goto(DENY_UNKNOWN_POD),
                vec![
                    chain(DENY_SPOOFED, "spoofed source or unknown pod interface", log::LogPrefix::Spoofed),
                    chain(DENY_UNKNOWN_POD, "to a pod interface without policy yet", log::LogPrefix::UnknownPod),
                ],
            )
        }
        None => (Verdict::Drop, Verdict::Drop, Vec::new()),
    };
    let mut base = Vec::new();
    let mut to_node = Vec::new();
    if let Some(bit) = revoked {
        let what = "connections revoked by a policy change";
        let (text, mut rules) = match log {
            Some(log) => (format!("{what}: {}", log.describe("TCP reset, dropped")), vec![log.rule(&log::LogPrefix::Revoked)]),
            None => (format!("{what}: TCP reset, dropped"), Vec::new()),
        };
        let comment = comment(&text);
        // As nft lists it: a TCP reset needs TCP.
        rules.extend([Rule::new(vec![Stmt::L4Proto(Proto::Tcp), Stmt::RejectTcpReset], None), Rule::verdict(Verdict::Drop)]);
        shared.push(Chain { name: REVOKED.into(), comment, hook: None, rules: rules.into() });
        base.push(revoked_rule(bit));
        to_node.push(revoked_rule(bit));
    }
    let invalid = Rule::new(vec![Stmt::CtState(vec![CtState::Invalid])], Some(Verdict::Drop));
    base.extend([established(), invalid.clone()]);
    base.extend([pod_interfaces(false, Verdict::Jump(FROM_PODS.into())), pod_interfaces(true, Verdict::Jump(TO_PODS.into()))]);
    // Established packets (most) decide at once; what finds the gateway before anything that
    // could take it for invalid.
    to_node.push(established());
    to_node.extend(link_local());
    to_node.push(invalid);
    to_node.extend(steered_dns(dns_mark));
    to_node.push(Rule::verdict(goto(FROM_PODS)));
    let spoof_check = |fam: Family| {
        Rule::new(vec![spoofed(fam), Stmt::Counter], Some(spoofed_verdict.clone()))
            .comment("unknown pod interface or spoofed source address")
    };
    let chains = [
        Chain {
            name: FROM_PODS.into(),
            comment: "packets from a pod on this node: source check, then the pod's egress policy".into(),
            hook: None,
            rules: Arc::new(vec![spoof_check(Family::V4), spoof_check(Family::V6), vmap(Field::IifName, EGRESS_MAP)]),
        },
        Chain {
            name: TO_PODS.into(),
            comment: "packets to a pod on this node: the pod's ingress policy".into(),
            hook: None,
            rules: Arc::new(vec![
                vmap(Field::OifName, INGRESS_MAP),
                Rule::new(vec![Stmt::Counter], Some(unknown)).comment("unknown pod interface: no policy programmed yet"),
            ]),
        },
        Chain {
            name: BASE_CHAIN.into(),
            comment: "routed pod traffic, after DNAT: policy sees pod addresses, not service addresses".into(),
            hook: Some(Hook { type_: "filter", hook: "forward", priority: "filter", policy: "accept" }),
            rules: base.into(),
        },
        Chain {
            name: TO_NODE.into(),
            comment: "packets from a pod on this node to the node itself: the pod's egress policy decides, as for forwarded ones".into(),
            hook: None,
            rules: to_node.into(),
        },
        Chain {
            name: INPUT_CHAIN.into(),
            comment:
                "packets to this node's own addresses, after DNAT: those of local pods go to to-node; the node's own traffic is not touched"
                    .into(),
            hook: Some(Hook { type_: "filter", hook: "input", priority: "filter", policy: "accept" }),
            rules: Arc::new(vec![pod_interfaces(false, goto(TO_NODE))]),
        },
    ];
    (chains, shared)
}

/// What the rules of one endpoint and direction share.
struct TierCtx<'a> {
    ep: &'a EndpointPolicy,
    dir: Direction,
    families: &'a [Family],
    /// The verdict that allows (`accept`, or `goto egress-allowed`).
    allow: &'a Verdict,
    /// The verdict that denies (`drop`, or `goto` the pod's logging chain).
    deny: &'a Verdict,
    /// What the chain names start with (`ingress`, `audit-egress`, ...).
    purpose: &'a str,
    /// What comments start with (`audit: ` in the audited view).
    note: &'a str,
}

struct Renderer<'a> {
    np: &'a NodePolicy,
    /// The NetworkPolicy stage of each direction ([`peers`]).
    plans: &'a [PeerPlan; 2],
    /// Sets rendered so far (this time or before, still valid).
    cache: &'a mut SetCache,
    /// The sets the chains rendered since it was cleared refer to.
    used: Vec<SetKey>,
    log: Option<log::DenyLog>,
    /// Revocation's ct mark bit (domain rules mark what they admit only with revocation).
    revoked: Option<u32>,
}

impl Renderer<'_> {
    /// The chains of one endpoint and direction, each before the chains that refer to it;
    /// the last one is the entry the dispatch map points at.
    ///
    /// Admin-tier rules come first (entry chain), then — in the *tail* chain, which a `Pass`
    /// jumps to — the NetworkPolicy stage when a NetworkPolicy isolates the pod (its allow
    /// rules, then drop), else the Baseline-tier rules and the default, allow. Without Admin
    /// rules the tail is the entry. Every verdict is final: an allowed egress packet goes on
    /// to the destination's ingress policy through `egress-allowed`, never by returning, so
    /// a verdict may be given at any depth.
    fn endpoint_chains(&mut self, ep: &EndpointPolicy, dir: Direction) -> Vec<Chain> {
        self.view_chains(ep, dir, ep.direction(dir), None)
    }

    /// The chains of `ep`'s audited view of `dir` (see [`DirectionPolicy::audit`]), laid out
    /// as [`Self::endpoint_chains`] but evaluated in the `audit` base chain, before the
    /// enforced one: what it would deny is logged (as audit) and accepted, what it would
    /// allow is accepted, so the enforced chains decide alone. `None`: no audited view (or no
    /// logging, without which auditing shows nothing).
    fn audit_chains(&mut self, ep: &EndpointPolicy, dir: Direction) -> Option<Vec<Chain>> {
        let log = self.log?;
        let view = ep.direction(dir).audit.as_deref()?;
        Some(self.view_chains(ep, dir, view, Some(log)))
    }

    /// The chains of one view of an endpoint direction, each before the chains that refer to
    /// it, the entry last: the enforced view (`audit` `None`), or the audited one.
    fn view_chains(&mut self, ep: &EndpointPolicy, dir: Direction, d: &DirectionPolicy, audit: Option<log::DenyLog>) -> Vec<Chain> {
        let pod = ep.pod.to_string();
        let (purpose, note) = match audit {
            None => (dir.as_field().to_string(), String::new()),
            Some(_) => (format!("audit-{}", dir.as_field()), "audit: ".to_string()),
        };
        let chain_comment = comment(&format!("{note}{dir} policy of pod {pod} ({})", ep.interface));
        let entry = names::dynamic(&purpose, &[&ep.interface, &pod, &chain_comment], &pod);
        let mut allow = match (dir, audit) {
            (Direction::Ingress, _) => Verdict::Accept,
            (Direction::Egress, None) => goto(EGRESS_ALLOWED),
            (Direction::Egress, Some(_)) => goto(AUDIT_EGRESS_ALLOWED),
        };
        let families: Vec<Family> =
            [(ep.has_v4(), Family::V4), (ep.has_v6(), Family::V6)].into_iter().filter(|(has, _)| *has).map(|(_, f)| f).collect();
        let mut chains = Vec::new();
        // The namespace asks for allowed connections to be logged: they go through a chain
        // that logs them (rate-limited) and allows.
        if let (Some(log), None, true) = (self.log, audit, ep.log_allowed) {
            let allow_comment = comment(&format!("{dir} of {pod} allowed: {} (flock.dev/log-allowed)", log.describe("allowed")));
            let name = names::dynamic(&format!("{purpose}-allow"), &[&ep.interface, &pod], &pod);
            let prefix = log::LogPrefix::Allow { direction: dir, interface: ep.interface.clone() };
            chains.push(log.chain(name.clone(), allow_comment, &prefix, vec![Rule::verdict(allow)]));
            allow = goto(&name);
        }
        // Denials go through one chain per pod and direction that logs them (rate-limited)
        // and drops — or, audited, logs them as audit and accepts — when something here
        // denies.
        let denies = d.is_isolated()
            || d.admin.iter().chain(&d.baseline).flat_map(|g| &g.policies).flat_map(|p| &p.rules).any(|r| r.action == Action::Deny);
        let deny = match (self.log, audit) {
            (Some(log), None) if denies => {
                let deny_comment = comment(&format!("{dir} of {pod} denied: {}", log.describe("dropped")));
                let name = names::dynamic(&format!("{purpose}-deny"), &[&ep.interface, &pod], &pod);
                let prefix = log::LogPrefix::Deny { direction: dir, interface: ep.interface.clone() };
                chains.push(log.chain(name.clone(), deny_comment, &prefix, vec![Rule::verdict(Verdict::Drop)]));
                goto(&name)
            }
            (_, Some(log)) if denies => {
                let deny_comment = comment(&format!("audit: {dir} of {pod} would be denied: {}", log.describe("accepted")));
                let name = names::dynamic(&format!("{purpose}-log"), &[&ep.interface, &pod], &pod);
                let prefix = log::LogPrefix::Audit { direction: dir, interface: ep.interface.clone() };
                chains.push(log.chain(name.clone(), deny_comment, &prefix, vec![Rule::verdict(Verdict::Accept)]));
                goto(&name)
            }
            _ => Verdict::Drop,
        };
        let ctx = TierCtx { ep, dir, families: &families, allow: &allow, deny: &deny, purpose: &purpose, note: &note };

        let mut tail_rules = Vec::new();
        if d.is_isolated() {
            // A rule allowing everything decides alone; otherwise the peer classes (the
            // enforced view's, whose class chains allow without logging), or (few lookups) one
            // rule per allow rule.
            let plan = &self.plans[usize::from(dir == Direction::Egress)];
            match d.rules.iter().find(|r| r.peer == PeerMatch::Any && r.ports == PortMatch::Any) {
                Some(rule) => self.allow_rule(rule, dir, &families, &allow, &mut tail_rules),
                None if audit.is_none() && !ep.log_allowed && plan.covers(&ep.interface) => {
                    tail_rules.extend(plan.rules(&ep.interface, &allow));
                    // Domain rules are not in the classes (their addresses are learned later).
                    for rule in d.rules.iter().filter(|r| matches!(r.peer, PeerMatch::Domains(_))) {
                        self.allow_rule(rule, dir, &families, &allow, &mut tail_rules);
                    }
                }
                None => {
                    for rule in &d.rules {
                        self.allow_rule(rule, dir, &families, &allow, &mut tail_rules);
                    }
                }
            }
            let why = if d.isolated_by.contains(&Isolation::UnknownPod) {
                format!("{pod} is unknown to flock: closed until its Pod is seen")
            } else {
                let by: Vec<String> = d.isolated_by.iter().map(ToString::to_string).collect();
                format!("{note}{dir} of {pod} not allowed (isolated by {})", by.join(", "))
            };
            tail_rules.push(Rule::new(vec![Stmt::Counter], Some(deny.clone())).comment(comment(&why)));
        } else {
            // Baseline: a Pass hands over to the default, allow.
            self.tier_groups(&ctx, Tier::Baseline, &d.baseline, &allow, &mut tail_rules, &mut chains);
            tail_rules
                .push(Rule::verdict(allow.clone()).comment(comment(&format!("{note}{dir} of {pod}: no rule decided, allowed (default)"))));
        }
        if d.admin.is_empty() {
            chains.push(Chain { name: entry, comment: chain_comment, hook: None, rules: tail_rules.into() });
            return chains;
        }
        let tail_comment = comment(&format!("{note}{dir} policy of pod {pod} after the Admin tier: NetworkPolicy, then Baseline"));
        let tail = names::dynamic(&format!("{purpose}-np"), &[&ep.interface, &pod, &tail_comment], &pod);
        chains.push(Chain { name: tail.clone(), comment: tail_comment, hook: None, rules: tail_rules.into() });
        let mut entry_rules = Vec::new();
        self.tier_groups(&ctx, Tier::Admin, &d.admin, &goto(&tail), &mut entry_rules, &mut chains);
        entry_rules.push(Rule::verdict(goto(&tail)).comment(comment(&format!("{note}{dir} of {pod}: no Admin rule decided"))));
        let entry_comment = comment(&format!("{note}{dir} policy of pod {pod} ({}): Admin tier first", ep.interface));
        chains.push(Chain { name: entry, comment: entry_comment, hook: None, rules: entry_rules.into() });
        chains
    }

    /// The rules of one tier, by priority. A group of one policy is written inline, first
    /// match deciding. A group of policies with equal priority (undefined by the API) is
    /// evaluated so the safest first match wins: every policy's Deny is checked first, then
    /// (Admin) its Pass, then its Accept — each check a chain of the policy's rules in order,
    /// the checked action giving its verdict and any other action `return`ing.
    fn tier_groups(
        &mut self,
        ctx: &TierCtx<'_>,
        tier: Tier,
        groups: &[PriorityGroup],
        pass: &Verdict,
        out: &mut Vec<Rule>,
        chains: &mut Vec<Chain>,
    ) {
        let pod = ctx.ep.pod.to_string();
        // Rules in a row (across policies of their own priority) with one verdict, the same
        // ports and exact address sets: whichever matches first, the verdict is the same, so
        // they share one set and one lookup.
        let mut run: Vec<(&TierRule, (bool, Verdict))> = Vec::new();
        for g in groups {
            // A denial is counted; every verdict is final.
            let verdict = |a: Action| match (a, tier) {
                (Action::Deny, _) => (true, ctx.deny.clone()),
                (Action::Accept, _) | (Action::Pass, Tier::Baseline) => (false, ctx.allow.clone()),
                (Action::Pass, Tier::Admin) => (false, pass.clone()),
            };
            if let [policy] = g.policies.as_slice() {
                for rule in &policy.rules {
                    let v = verdict(rule.action);
                    let joins = run.last().is_some_and(|(last, last_v)| {
                        *last_v == v && last.ports == rule.ports && mergeable(&last.peer).is_some() && mergeable(&rule.peer).is_some()
                    });
                    if !joins {
                        self.tier_run(ctx, &mut run, out);
                    }
                    run.push((rule, v));
                }
                continue;
            }
            self.tier_run(ctx, &mut run, out);
            // Baseline: Pass and Accept both allow, one check.
            let checks: &[&[Action]] = match tier {
                Tier::Admin => &[&[Action::Deny], &[Action::Pass], &[Action::Accept]],
                Tier::Baseline => &[&[Action::Deny], &[Action::Pass, Action::Accept]],
            };
            for check in checks {
                for policy in &g.policies {
                    if !policy.rules.iter().any(|r| check.contains(&r.action)) {
                        continue;
                    }
                    let what: Vec<String> = check.iter().map(ToString::to_string).collect();
                    let chain_comment = comment(&format!(
                        "{}{} of {pod}: does {} first match {}? ({tier} tier, equal priority)",
                        ctx.note,
                        ctx.dir,
                        policy.name,
                        what.join(" or ")
                    ));
                    let name = names::dynamic(&format!("{}-tie", ctx.purpose), &[&ctx.ep.interface, &chain_comment], &pod);
                    let mut rules = Vec::new();
                    for rule in &policy.rules {
                        let v = if check.contains(&rule.action) { verdict(rule.action) } else { (false, Verdict::Return) };
                        self.tier_rule(ctx, rule, v, &mut rules);
                    }
                    out.push(Rule::verdict(Verdict::Jump(name.clone())).comment(chain_comment.clone()));
                    chains.push(Chain { name, comment: chain_comment, hook: None, rules: rules.into() });
                }
            }
        }
        self.tier_run(ctx, &mut run, out);
    }

    /// The rules of a run of tier rules (see [`Self::tier_groups`]), emptying it: one rule
    /// per family on the run's shared set, or the rule itself when it is alone.
    fn tier_run(&mut self, ctx: &TierCtx<'_>, run: &mut Vec<(&TierRule, (bool, Verdict))>, out: &mut Vec<Rule>) {
        match run.as_slice() {
            [] => {}
            [(rule, v)] => self.tier_rule(ctx, rule, v.clone(), out),
            [(first, (counted, verdict)), .., (last, _)] => {
                let defs: Vec<PeerDef> = run.iter().filter_map(|(r, _)| mergeable(&r.peer).cloned()).collect();
                let note = comment(&format!(
                    "{} to {}: {} ({} rules in a row with one verdict: one set)",
                    first.origin,
                    last.origin,
                    first.action,
                    run.len()
                ));
                let ports = port_match(&first.ports);
                for fam in ctx.families {
                    if let Some(set) = self.union_set(&defs, *fam) {
                        let mut stmts = vec![Stmt::Lookup { fields: vec![peer_field(ctx.dir, *fam)], neg: false, set }];
                        stmts.extend(ports.iter().cloned());
                        out.push(verdict_rule(stmts, *counted, verdict, &note));
                    }
                }
            }
        }
        run.clear();
    }

    /// One ClusterNetworkPolicy matcher with `verdict` (counted, with `true`).
    fn tier_rule(&mut self, ctx: &TierCtx<'_>, rule: &TierRule, verdict: (bool, Verdict), out: &mut Vec<Rule>) {
        let note = comment(&format!("{}: {}", rule.origin, rule.action));
        self.matcher(&rule.peer, &rule.ports, ctx.dir, ctx.families, verdict, &note, out);
    }

    fn allow_rule(&mut self, rule: &AllowRule, dir: Direction, families: &[Family], verdict: &Verdict, out: &mut Vec<Rule>) {
        let origins: Vec<String> = rule.origins.iter().map(ToString::to_string).collect();
        let note = comment(&origins.join(", "));
        self.matcher(&rule.peer, &rule.ports, dir, families, (false, verdict.clone()), &note, out);
    }

    /// The rules matching `peer` and `ports` (one per family for address sets; none when the
    /// peer has no address: an empty set matches nothing), each with `verdict` (counted, with
    /// `true`).
    #[allow(clippy::too_many_arguments)]
    fn matcher(
        &mut self,
        peer: &PeerMatch,
        ports: &PortMatch,
        dir: Direction,
        families: &[Family],
        (counted, verdict): (bool, Verdict),
        note: &str,
        out: &mut Vec<Rule>,
    ) {
        let ports = port_match(ports);
        let addr = |fam: Family| peer_field(dir, fam);
        let rule = |mut stmts: Vec<Stmt>, tail: &[Stmt]| {
            stmts.extend(tail.iter().cloned());
            verdict_rule(stmts, counted, &verdict, note)
        };
        match peer {
            PeerMatch::Any => out.push(rule(ports, &[])),
            PeerMatch::Addresses(def) => {
                for fam in families {
                    if let Some(set) = self.peer_set(def, *fam) {
                        let mut stmts = vec![Stmt::Lookup { fields: vec![addr(*fam)], neg: false, set }];
                        stmts.extend(ports.iter().cloned());
                        out.push(rule(stmts, &[]));
                    }
                }
            }
            PeerMatch::NamedPort(def) => {
                for fam in families {
                    if let Some(set) = self.port_set(def, *fam) {
                        out.push(rule(
                            vec![Stmt::Lookup { fields: vec![addr(*fam), Field::L4Proto, Field::ThDport], neg: false, set }],
                            &[],
                        ));
                    }
                }
            }
            // Learned addresses, in sets the proxy fills. A connection one admits is marked so
            // revocation keeps it after the address's TTL (only an accepting rule has them).
            PeerMatch::Domains(def) => {
                let mark: Vec<Stmt> = match self.revoked {
                    Some(_) if dir == Direction::Egress => vec![Stmt::SetMarkBit { ct: true, bit: DOMAIN_MARK }],
                    _ => Vec::new(),
                };
                for fam in families {
                    let set = domain_set_name(def, *fam == Family::V6);
                    let mut stmts = vec![Stmt::Lookup { fields: vec![addr(*fam)], neg: false, set }];
                    stmts.extend(ports.iter().cloned());
                    out.push(rule(stmts, &mark));
                }
            }
        }
    }

    /// The name of the set for `def` in `fam`, or `None` when it has no address of that
    /// family (a rule matching an empty set matches nothing and is left out).
    fn peer_set(&mut self, def: &PeerDef, fam: Family) -> Option<String> {
        // One search when the set is cached (definitions compare field by field).
        let slots = match self.cache.peers.get_mut(def) {
            Some(slots) => slots,
            None => self.cache.peers.entry(def.clone()).or_default(),
        };
        let slot = &mut slots[fam.index()];
        if slot.is_none() {
            *slot = Some(Self::new_peer_set(self.np, def, fam));
        }
        let name = slot.as_ref().and_then(Option::as_ref).map(|s| s.name.clone())?;
        self.used.push(SetKey::Peer(def.clone(), fam));
        Some(name)
    }

    fn new_peer_set(np: &NodePolicy, def: &PeerDef, fam: Family) -> Option<Set> {
        let addrs = np.peer_sets.get(def)?;
        let elements: Vec<Element> = match fam {
            Family::V4 => addrs.v4.iter().map(|(n, c)| element_of(Key::one(KeyPart::Net((*n).into())), c)).collect(),
            Family::V6 => addrs.v6.iter().map(|(n, c)| element_of(Key::one(KeyPart::Net((*n).into())), c)).collect(),
        };
        if elements.is_empty() {
            return None;
        }
        let block = matches!(def, PeerDef::Block(_));
        // Every pod's set holds the pod CIDRs as ranges; without any (no Node has a pod CIDR)
        // it is pod addresses alone, an exact set that changes by its elements (an interval
        // set is rewritten whole at every change).
        let ranges = match fam {
            Family::V4 => addrs.v4.keys().any(|n| n.prefix_len() < 32),
            Family::V6 => addrs.v6.keys().any(|n| n.prefix_len() < 128),
        };
        let interval = block || (crate::translate::PodRanges::serve(def) && ranges);
        let purpose = format!("{}-{}", if block { "cidr" } else { "peers" }, fam.tag());
        let set_comment = comment(&def.to_string());
        let name = names::dynamic(&purpose, &[&format!("{def:?}"), &set_comment], &def.short());
        // Elements stay in address order (the IR's), which is how nft lists intervals.
        Some(Set {
            name,
            comment: set_comment,
            key: vec![addr_type(fam)],
            data: None,
            interval,
            timeout: false,
            limit: None,
            elements: elements.into(),
        })
    }

    /// The name of the set of every address of `defs` (exact sets: [`mergeable`]) in `fam`,
    /// or `None` when none has an address of that family.
    fn union_set(&mut self, defs: &[PeerDef], fam: Family) -> Option<String> {
        let slots = match self.cache.unions.get_mut(defs) {
            Some(slots) => slots,
            None => self.cache.unions.entry(defs.to_vec()).or_default(),
        };
        let slot = &mut slots[fam.index()];
        if slot.is_none() {
            *slot = Some(Self::new_union_set(self.np, defs, fam));
        }
        let name = slot.as_ref().and_then(Option::as_ref).map(|s| s.name.clone());
        // Counted even when empty, so the set stays cached while a chain may need it.
        self.used.push(SetKey::Union(defs.to_vec(), fam));
        name
    }

    fn new_union_set(np: &NodePolicy, defs: &[PeerDef], fam: Family) -> Option<Set> {
        // An address in several sets keeps the comment of the first (one pod either way).
        let mut addrs: BTreeMap<ipnet::IpNet, &str> = BTreeMap::new();
        for set in defs.iter().filter_map(|d| np.peer_sets.get(d)) {
            match fam {
                Family::V4 => set.v4.iter().for_each(|(n, c)| {
                    addrs.entry((*n).into()).or_insert(c);
                }),
                Family::V6 => set.v6.iter().for_each(|(n, c)| {
                    addrs.entry((*n).into()).or_insert(c);
                }),
            }
        }
        if addrs.is_empty() {
            return None;
        }
        let elements: Vec<Element> = addrs.into_iter().map(|(n, c)| element_of(Key::one(KeyPart::Net(n)), c)).collect();
        let shorts: Vec<String> = defs.iter().map(PeerDef::short).collect();
        let set_comment =
            comment(&format!("{} peer sets in one (tier rules in a row with one verdict): {}", defs.len(), shorts.join(", ")));
        let name =
            names::dynamic(&format!("peers-{}", fam.tag()), &[&format!("{defs:?}"), &set_comment], &format!("{}-in-one", defs.len()));
        Some(Set {
            name,
            comment: set_comment,
            key: vec![addr_type(fam)],
            data: None,
            interval: false,
            timeout: false,
            limit: None,
            elements: elements.into(),
        })
    }

    fn port_set(&mut self, def: &NamedPortDef, fam: Family) -> Option<String> {
        if !self.cache.ports.contains_key(def) {
            self.cache.ports.insert(def.clone(), [None, None]);
        }
        let slot = self.cache.ports.get_mut(def).map(|f| &mut f[fam.index()])?;
        if slot.is_none() {
            *slot = Some(Self::new_port_set(self.np, def, fam));
        }
        let name = slot.as_ref().and_then(Option::as_ref).map(|s| s.name.clone())?;
        self.used.push(SetKey::Port(def.clone(), fam));
        Some(name)
    }

    fn new_port_set(np: &NodePolicy, def: &NamedPortDef, fam: Family) -> Option<Set> {
        let set = np.port_sets.get(def)?;
        let elements: Vec<Element> = match fam {
            Family::V4 => set.v4.iter().map(|((a, p, n), c)| element_of(port_key((*a).into(), *p, *n), c)).collect(),
            Family::V6 => set.v6.iter().map(|((a, p, n), c)| element_of(port_key((*a).into(), *p, *n), c)).collect(),
        };
        if elements.is_empty() {
            return None;
        }
        let set_comment = comment(&def.to_string());
        let name = names::dynamic(&format!("nport-{}", fam.tag()), &[&format!("{def:?}"), &set_comment], &def.short());
        Some(Set {
            name,
            comment: set_comment,
            key: vec![addr_type(fam), "inet_proto", "inet_service"],
            data: None,
            interval: false,
            timeout: false,
            limit: None,
            elements: elements.into(),
        })
    }
}

fn element_of(key: Key, c: &str) -> Element {
    Element { key, comment: comment(c), verdict: None }
}

/// A named port's element: the pod's address, the protocol and the port number.
fn port_key(addr: std::net::IpAddr, p: crate::model::Protocol, port: u16) -> Key {
    Key::new(vec![KeyPart::Addr(addr), KeyPart::Proto(p.into()), KeyPart::Ports(port, port)])
}

/// `tcp dport 80`, `tcp dport { 80, 8000-9000 }`, `meta l4proto udp`, or nothing.
fn port_match(m: &PortMatch) -> Vec<Stmt> {
    match m {
        PortMatch::Any => Vec::new(),
        PortMatch::Protocol(p, PortRanges::All) => vec![Stmt::L4Proto((*p).into())],
        PortMatch::Protocol(p, PortRanges::Ranges(rs)) => {
            let ports = match rs.as_slice() {
                [(s, e)] if s == e => Ports::One(*s),
                [(s, e)] => Ports::Range(*s, *e),
                _ => Ports::Set(rs.clone()),
            };
            vec![Stmt::Dport((*p).into(), ports)]
        }
    }
}

#[cfg(test)]
mod tests;
