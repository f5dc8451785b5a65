//! Errors of the test handle ([`crate::ApiServer`]); HTTP errors are `Status` responses
//! (see the `status` module) and never surface here.

use std::{path::PathBuf, time::Duration};

use crate::status::ApiError;

/// What can go wrong starting the server or using its handle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The unix socket could not be bound.
    #[error("failed to bind unix socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TCP address could not be bound.
    #[error("failed to listen on {addr}: {source}")]
    BindTcp {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The temporary directory for the socket could not be created.
    #[error("failed to create temporary directory {path}: {source}")]
    TempDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No resource is registered for this `apiVersion` and `kind`.
    #[error("no resource is registered for apiVersion {api_version:?}, kind {kind:?}")]
    UnknownKind {
        /// The object's `apiVersion`.
        api_version: String,
        /// The object's `kind`.
        kind: String,
    },
    /// The object has no string `apiVersion` or `kind`.
    #[error("the object has no apiVersion and kind")]
    MissingType,
    /// The store refused the object (e.g. no name), as the API would with this status.
    #[error("the store rejected the object: {message} ({code} {reason})")]
    Rejected {
        /// HTTP code the API would answer.
        code: u16,
        /// Kubernetes `reason`.
        reason: String,
        /// Message.
        message: String,
    },
    /// A typed object could not be converted to or from JSON.
    #[error("failed to convert the object: {0}")]
    Json(#[from] serde_json::Error),
    /// `wait_for_watches` timed out.
    #[error("timed out after {timeout:?} waiting for {wanted} open watches ({open} open)")]
    WatchTimeout {
        /// Watches waited for.
        wanted: usize,
        /// Watches open at the timeout.
        open: usize,
        /// The timeout.
        timeout: Duration,
    },
}

/// Result of the handle's methods.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn rejected(err: ApiError) -> Self {
        Self::Rejected { code: err.code, reason: err.reason.to_owned(), message: err.message }
    }
}
