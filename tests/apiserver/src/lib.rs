//! An in-memory Kubernetes API server for tests, on a unix socket, with fault injection.
//!
//! It speaks enough of the real HTTP API — discovery, list with pagination and selectors,
//! watch with bookmarks, 410 Expired and 504 "Too large resource version", state loss as after
//! an etcd restore ([`ApiServer::restore`]), create/get/replace/delete, merge/JSON/strategic
//! patches, server-side apply, `/status` — that the real `kube::Client`, `kube::Api`,
//! `kube::discovery` and `kube::runtime::watcher`/`reflector` work against it unchanged. No
//! IP address is involved: the server listens on a unix socket and [`ApiServer::client`]
//! dials it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use flock_test_apiserver::ApiServer;
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::{Api, api::ListParams};
//!
//! let server = ApiServer::start_temp().await?; // or ApiServer::start("/tmp/x/api.sock")
//! server.apply(serde_json::json!({
//!     "apiVersion": "v1", "kind": "Pod",
//!     "metadata": {"name": "web", "namespace": "shop"},
//!     "spec": {"nodeName": "node-1", "containers": []},
//! }))?;
//! let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
//! assert_eq!(pods.list(&ListParams::default()).await?.items.len(), 1);
//! server.drop_watches(); // faults: unavailable, expire_history, garbage, slow, fail_next…
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Modules: `server` (the [`ApiServer`] handle), `http` (routing and responses), `store`
//! (objects, resourceVersions, history, watches; `store::apply`: server-side apply), `watch`
//! (watch response streams), `patch` (merge/JSON patch and the server-side apply rules),
//! `selector` (label and field selectors), `registry` (served resources and discovery),
//! `faults` (fault switches and the request log), `status` (`Status` error bodies), `meta`
//! (uids, timestamps), `client` (the unix-socket `kube::Client`), `load` (CRDs and manifests
//! from files, for the `flock-test-apiserver` binary).
//!
//! What is approximated or left out is listed in the crate's `README.md`.

mod client;
mod error;
mod faults;
mod http;
pub mod load;
mod meta;
mod patch;
mod registry;
mod selector;
mod server;
mod status;
mod store;
mod watch;

pub use client::{Counted, UnixConnector, client_for_address, client_for_socket, client_for_socket_counting};
pub use error::{Error, Result};
pub use faults::{FailRule, RequestRecord};
pub use registry::{Gvr, ResourceDef};
pub use server::{ApiServer, Config};
pub use store::Backup;
