//! Where the API server is, for the profiles' `apiServer` rule: the address of the client
//! configuration (in a pod, the `kubernetes` Service's ClusterIP) and the endpoints of the
//! `default/kubernetes` EndpointSlices. flock matches policy after kube-proxy's DNAT, so a
//! pod's connection to the Service address arrives as a connection to an endpoint address
//! and port: the endpoints are the addresses that matter; the Service address is kept for
//! enforcers that match before DNAT.
//!
//! No address at all is a startup error: a controller that started anyway would render
//! profiles with `apiServer: true` without the rule, and their runs would fail in ways that
//! are hard to trace. Both families are kept; loopback and unspecified addresses are dropped
//! (no pod reaches them through its node). [`follow`] keeps the set current as control-plane
//! endpoints change, so every run's policy follows.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::render::{ApiEndpoint, ClusterConfig};

/// The label of the `kubernetes` Service's EndpointSlices (in namespace `default`).
pub(crate) const SLICE_SELECTOR: &str = "kubernetes.io/service-name=kubernetes";
/// Their namespace.
pub(crate) const SLICE_NAMESPACE: &str = "default";

/// Why the API server's addresses are unknown.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("the API server URL {url:?} has no host")]
    NoHost { url: String },
    #[error("the API server URL {url:?} has a bad port")]
    BadPort { url: String },
    #[error("cannot resolve the API server host {host}: {error}")]
    Resolve { host: String, error: std::io::Error },
    #[error("cannot list the EndpointSlices of default/kubernetes: {0}")]
    List(kube::Error),
    #[error(
        "no address for the API server (client configuration: {from}; EndpointSlices of default/kubernetes: none): refusing to start rather than render profiles' apiServer rule empty"
    )]
    NoAddress { from: String },
}

/// Whether a pod can reach the address through its node (loopback and unspecified
/// addresses are local to whoever uses them).
pub(crate) fn routable(ip: &IpAddr) -> bool {
    !ip.is_loopback() && !ip.is_unspecified()
}

/// Host and port of an API server URL: `https://host:port`, `host:port`, `[v6]:port` or a
/// bare host (port 443, or 80 for `http://`).
pub(crate) fn host_port(url: &str) -> Result<(String, u16), ApiServerError> {
    let (default_port, rest) = match url.split_once("://") {
        Some(("http", rest)) => (80, rest),
        Some((_, rest)) => (443, rest),
        None => (443, url),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| ApiServerError::NoHost { url: url.to_string() })?;
        (host, after.strip_prefix(':'))
    } else if authority.matches(':').count() > 1 {
        // A bare IPv6 address.
        (authority, None)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(ApiServerError::NoHost { url: url.to_string() });
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| ApiServerError::BadPort { url: url.to_string() })?,
        None => default_port,
    };
    Ok((host.to_string(), port))
}

/// The API server endpoints a URL names: its address, or what its host name resolves to.
pub(crate) async fn from_url(url: &str) -> Result<BTreeSet<ApiEndpoint>, ApiServerError> {
    let (host, port) = host_port(url)?;
    let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|error| ApiServerError::Resolve { host: host.clone(), error })?
            .map(|sa| sa.ip())
            .collect(),
    };
    Ok(addrs.into_iter().filter(routable).map(|addr| ApiEndpoint { addr, port }).collect())
}

/// The endpoints of EndpointSlices (those not marked unready), on their TCP ports.
pub(crate) fn from_slices<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> BTreeSet<ApiEndpoint> {
    let mut out = BTreeSet::new();
    for slice in slices {
        let ports: Vec<u16> = slice
            .ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
            .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
            .collect();
        for e in &slice.endpoints {
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for addr in e.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()).filter(routable) {
                out.extend(ports.iter().map(|&port| ApiEndpoint { addr, port }));
            }
        }
    }
    out
}

/// The API server's endpoints: `fixed` (those of the client configuration's URL, `url`,
/// when there is one) and the `default/kubernetes` EndpointSlices'. Empty is an error.
pub(crate) async fn discover(
    client: &Client,
    fixed: &BTreeSet<ApiEndpoint>,
    url: Option<&str>,
) -> Result<BTreeSet<ApiEndpoint>, ApiServerError> {
    let mut all = fixed.clone();
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), SLICE_NAMESPACE)
        .list(&ListParams::default().labels(SLICE_SELECTOR))
        .await
        .map_err(ApiServerError::List)?;
    all.extend(from_slices(&slices.items));
    if all.is_empty() {
        return Err(ApiServerError::NoAddress { from: url.unwrap_or("none").to_string() });
    }
    Ok(all)
}

/// Follows the `default/kubernetes` EndpointSlices until the stream ends, setting `fixed`
/// plus their endpoints as the cluster configuration's API server on `tx` whenever that
/// changes. An empty set is never published: the last known addresses stay (an API server
/// without endpoints is a transient state of the control plane, and an empty rule would cut
/// every run off).
pub(crate) async fn follow(client: Client, fixed: BTreeSet<ApiEndpoint>, tx: watch::Sender<ClusterConfig>) {
    let api = Api::<EndpointSlice>::namespaced(client, SLICE_NAMESPACE);
    let mut slices = Slices::default();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default().labels(SLICE_SELECTOR)).default_backoff());
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, "watching the EndpointSlices of default/kubernetes");
                continue;
            }
        };
        let Some(all) = slices.on(event, &fixed) else { continue };
        if all.is_empty() {
            tracing::warn!("the API server has no endpoints; keeping the last known addresses");
            continue;
        }
        tx.send_if_modified(|cluster| {
            if cluster.api_server == all {
                return false;
            }
            tracing::info!(addresses = %describe(&all), "API server addresses changed");
            cluster.api_server = all;
            true
        });
    }
}

/// The EndpointSlices [`follow`] knows, folded from the watch's events.
#[derive(Default)]
struct Slices {
    known: BTreeMap<String, EndpointSlice>,
    listing: BTreeMap<String, EndpointSlice>,
}

impl Slices {
    /// Takes one event; the addresses (with `fixed`) when it may have changed them.
    fn on(&mut self, event: Event<EndpointSlice>, fixed: &BTreeSet<ApiEndpoint>) -> Option<BTreeSet<ApiEndpoint>> {
        match event {
            Event::Apply(s) => {
                self.known.insert(s.name_any(), s);
            }
            Event::Delete(s) => {
                self.known.remove(&s.name_any());
            }
            // A (re-)listing changes nothing until it is complete: published before that,
            // the addresses of a half-read listing would narrow every run's policy (the first
            // listing, from nothing to the fixed addresses alone) for a moment.
            Event::Init => {
                self.listing.clear();
                return None;
            }
            Event::InitApply(s) => {
                self.listing.insert(s.name_any(), s);
                return None;
            }
            Event::InitDone => self.known = std::mem::take(&mut self.listing),
        }
        let mut all = fixed.clone();
        all.extend(from_slices(self.known.values()));
        Some(all)
    }
}

/// `198.51.100.1:443, [2001:db8::1]:6443`
pub(crate) fn describe(endpoints: &BTreeSet<ApiEndpoint>) -> String {
    endpoints.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, addr: &str) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addr]}],
            "ports": [{"port": 6443, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    #[test]
    fn a_listing_is_published_only_once_complete() {
        let fixed: BTreeSet<ApiEndpoint> = [ApiEndpoint { addr: "198.18.240.1".parse().unwrap(), port: 443 }].into();
        let addrs = |v: Option<BTreeSet<ApiEndpoint>>| v.map(|s| s.iter().map(ToString::to_string).collect::<Vec<_>>());
        let mut s = Slices::default();
        // The first listing: nothing until it is done (not the fixed address alone).
        assert_eq!(addrs(s.on(Event::Init, &fixed)), None);
        assert_eq!(addrs(s.on(Event::InitApply(slice("kubernetes", "198.18.250.2")), &fixed)), None);
        assert_eq!(addrs(s.on(Event::InitDone, &fixed)).unwrap(), ["198.18.240.1:443", "198.18.250.2:6443"]);
        // A re-listing keeps the known addresses until it is complete, then replaces them.
        assert_eq!(addrs(s.on(Event::Init, &fixed)), None);
        assert_eq!(addrs(s.on(Event::InitApply(slice("kubernetes", "198.18.250.9")), &fixed)), None);
        assert_eq!(addrs(s.on(Event::InitDone, &fixed)).unwrap(), ["198.18.240.1:443", "198.18.250.9:6443"]);
        assert_eq!(addrs(s.on(Event::Delete(slice("kubernetes", "198.18.250.9")), &fixed)).unwrap(), ["198.18.240.1:443"]);
    }

    #[test]
    fn urls() {
        let hp = |u: &str| host_port(u).map_err(|e| e.to_string());
        assert_eq!(hp("https://198.18.0.10:6443").unwrap(), ("198.18.0.10".into(), 6443));
        assert_eq!(hp("https://198.18.0.10").unwrap(), ("198.18.0.10".into(), 443));
        assert_eq!(hp("http://api.example:8080/base?x=1").unwrap(), ("api.example".into(), 8080));
        assert_eq!(hp("198.18.0.10:6443").unwrap(), ("198.18.0.10".into(), 6443));
        assert_eq!(hp("api.example").unwrap(), ("api.example".into(), 443));
        assert_eq!(hp("https://[2001:db8::1]:6443/").unwrap(), ("2001:db8::1".into(), 6443));
        assert_eq!(hp("2001:db8::1").unwrap(), ("2001:db8::1".into(), 443));
        assert!(hp("https://").is_err());
        assert!(hp("https://198.18.0.10:0").is_err());
        assert!(hp("https://198.18.0.10:http").is_err());
    }

    #[tokio::test]
    async fn literal_addresses_need_no_resolver() {
        let got = from_url("https://[2001:db8::1]:6443").await.unwrap();
        assert_eq!(got.into_iter().collect::<Vec<_>>(), [ApiEndpoint { addr: "2001:db8::1".parse().unwrap(), port: 6443 }]);
        // Loopback and unspecified addresses are never a pod's destination.
        assert!(from_url("https://[::1]:6443").await.unwrap().is_empty());
        assert!(from_url("https://0.0.0.0:6443").await.unwrap().is_empty());
    }

    #[test]
    fn slices_give_ready_endpoints_on_tcp_ports() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["198.18.250.2"], "conditions": {"ready": true}},
                {"addresses": ["198.18.250.3"], "conditions": {"ready": false}},
                {"addresses": ["198.18.250.4"]}
            ],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}, {"name": "x", "port": 53, "protocol": "UDP"}]
        }))
        .unwrap();
        let got: Vec<String> = from_slices([&slice]).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["198.18.250.2:6443", "198.18.250.4:6443"]);
    }
}
