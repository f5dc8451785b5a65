//! flock's CNI plugin and the contract it shares with flock-agent.
//!
//! This crate is the dependency root of flock: the agent (`flock`) depends on it, never the
//! reverse, and it depends on no Kubernetes client and no async runtime, so the plugin binary
//! stays small and starts fast. It owns the one function that names a pod's host-side
//! interface ([`host_interface_name`]), because the plugin creates that interface and the
//! agent keys its nftables dispatch maps on the same name — before the interface exists —
//! and the plugin/agent protocol ([`protocol`]), used by both sides.

pub mod attachment_file;
pub mod dataplane;
pub mod env;
pub mod ipam;
pub mod log;
pub mod naming;
pub mod netlink;
pub mod netns;
pub mod plugin;
pub mod protocol;
pub mod removal;
pub mod runtime;
pub mod spec;
pub mod state;
#[doc(hidden)]
pub mod testing;

pub use naming::{HOST_INTERFACE_PREFIX, host_interface_name, is_host_interface_name, pod_link_local};
