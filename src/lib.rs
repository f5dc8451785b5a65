//! flock: a Kubernetes CNI agent and NetworkPolicy enforcer on nftables.
//!
//! The pipeline, one module per stage:
//!
//! ```text
//!  source ──► model (snapshot) ──► translate ──► render ──► apply
//!  (manifests,  plain data         pure:           pure,        nft -f -, one
//!   informers,  the stages share   NetworkPolicy → deterministic atomic transaction,
//!   CNI ADD)                       per-pod IR      IR → nft text skipped when equal
//! ```
//!
//! [`translate`] and [`render`] are pure functions (no I/O, clock, process or async runtime),
//! so they are unit-tested, golden-tested and fuzzed directly. [`nft`] models the subset of
//! nft syntax flock writes: it backs the in-memory fake applier and the packet tracer used by
//! tests. [`apply`] is the edge that runs `nft`.
//!
//! Around the pipeline: [`source`] (the static and the Kubernetes informer sources),
//! [`agent`] (the node agent core: endpoint registry, CNI socket, sync loop), [`dns_proxy`]
//! (egress by name: the agent's DNS proxy, its learning and the socket keeper), [`daemon`]
//! (flock-agent wired), [`report`] (a policy's problems reported once for the cluster),
//! [`controller`] (flock-controller) and [`process`] (what both daemons share). flockctl's
//! simulated cluster, synthetic clusters and conformance runner are modules of this crate
//! only with the `tool` feature (on by default, which flockctl requires; the agent and the
//! controller build without it), hidden from its documentation: they are the tool's, not a
//! library API.

#![warn(unreachable_pub)]

pub mod agent;
pub mod apply;
#[cfg(feature = "tool")]
#[doc(hidden)]
pub mod conformance;
pub mod conntrack;
pub mod controller;
pub mod crd;
pub mod daemon;
pub mod dns;
pub mod dns_proxy;
pub mod explain;
#[cfg(feature = "arbitrary")]
#[doc(hidden)]
pub mod fuzzing;
pub mod lease;
pub mod model;
pub mod nflog;
pub(crate) mod nfnetlink;
pub use flock_cni::netns;
pub mod nft;
pub mod process;
#[cfg(any(test, feature = "testkit"))]
#[doc(hidden)]
pub mod reference;
pub mod removal;
pub mod render;
pub mod report;
pub mod revoke;
#[cfg(feature = "tool")]
#[doc(hidden)]
pub mod sim;
pub mod slices;
pub mod source;
#[cfg(feature = "tool")]
#[doc(hidden)]
pub mod synth;
#[cfg(any(test, feature = "testkit"))]
#[doc(hidden)]
pub mod testkit;
pub mod text;
pub mod translate;

/// A panic's message, when it was given one (`panic!` with a literal or a format).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
}
