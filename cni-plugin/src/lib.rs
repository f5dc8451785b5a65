//! flock's CNI plugin and the contract it shares with flock-agent.
//!
//! This crate is the dependency root of flock: the agent (`flock`) depends on it, never the
//! reverse, and it depends on no Kubernetes client and no async runtime, so the plugin binary
//! stays small and starts fast. It owns the one function that names a pod's host-side
//! interface ([`host_interface_name`]), because the plugin creates that interface and the
//! agent keys its nftables dispatch maps on the same name — before the interface exists.

pub mod naming;

pub use naming::{HOST_INTERFACE_PREFIX, host_interface_name, is_host_interface_name};
