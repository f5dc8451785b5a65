//! What the controller decides once at start: whether new runs' policies are enforced
//! (`--enforce auto|on|off`, and in `auto` a probe for an enforcer), and which policy kind it
//! emits (CiliumNetworkPolicy where `cilium.io/v2` serves it, else NetworkPolicy).
//!
//! The probe asks first for a ready flock-agent DaemonSet (flock's install identity), then
//! for the other NetworkPolicy enforcers Paddock knows, by their pods' labels in
//! `kube-system`. It reads the API directly (no cache is primed at start). A probe error
//! means enforcement off, logged and reported as an Event by the caller. The probe runs
//! once: every run pins the decision it was reconciled under, so a later probe could only
//! change new runs, and restarting the controller does exactly that.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, GroupVersionKind, ListParams};
use kube::{Api, Client};

use super::enforced::Verify;
use super::{CILIUM_GROUP, CILIUM_KIND, CILIUM_VERSION};

/// `--enforce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnforceMode {
    /// Enforce when an enforcer is found at start.
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for EnforceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("{s:?}: expected auto, on or off")),
        }
    }
}

impl EnforceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeResult {
    pub(crate) found: bool,
    /// The enforcer found is flock-agent.
    pub(crate) flock: bool,
    pub(crate) reason: String,
}

/// The probe could not tell.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot read DaemonSet {namespace}/{name}: {error}")]
    DaemonSet { namespace: String, name: String, error: kube::Error },
    #[error("cannot list pods in kube-system with {selector}: {error}")]
    Pods { selector: String, error: kube::Error },
}

impl ProbeError {
    pub(crate) fn kube_error(&self) -> &kube::Error {
        match self {
            Self::DaemonSet { error, .. } | Self::Pods { error, .. } => error,
        }
    }
}

/// The decision new runs pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub(crate) mode: EnforceMode,
    pub enabled: bool,
    pub reason: String,
}

/// The decision table: `on` and `off` decide alone (an explicit off wins over any probe);
/// `auto` follows the probe, and a failed probe means off.
pub(crate) fn decide(mode: EnforceMode, probe: Option<&Result<ProbeResult, ProbeError>>) -> Decision {
    let (enabled, reason) = match (mode, probe) {
        (EnforceMode::On, _) => (true, "--enforce=on".to_string()),
        (EnforceMode::Off, _) => (false, "--enforce=off".to_string()),
        (EnforceMode::Auto, Some(Ok(p))) => (p.found, p.reason.clone()),
        (EnforceMode::Auto, Some(Err(e))) => (false, format!("the enforcer probe failed: {e}")),
        (EnforceMode::Auto, None) => (false, "no enforcer probe was run".to_string()),
    };
    Decision { mode, enabled, reason }
}

/// The flock-agent DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRef {
    pub namespace: String,
    pub name: String,
}

impl Default for AgentRef {
    fn default() -> Self {
        Self { namespace: "flock-system".into(), name: "flock-agent".into() }
    }
}

/// Other enforcers (name, label selector of their pods in kube-system), in probe order.
pub(crate) const OTHER_ENFORCERS: [(&str, &str); 6] = [
    ("calico", "k8s-app=calico-node"),
    ("cilium", "k8s-app=cilium"),
    ("cilium", "app=cilium"),
    ("weave-net", "name=weave-net"),
    ("kube-router", "k8s-app=kube-router"),
    ("antrea", "app.kubernetes.io/name=antrea-agent"),
];

/// Looks for an enforcer: a flock-agent DaemonSet with a ready pod, then the others.
pub(crate) async fn probe(client: &Client, agent: &AgentRef) -> Result<ProbeResult, ProbeError> {
    let ds = Api::<DaemonSet>::namespaced(client.clone(), &agent.namespace)
        .get_opt(&agent.name)
        .await
        .map_err(|error| ProbeError::DaemonSet { namespace: agent.namespace.clone(), name: agent.name.clone(), error })?;
    let agent_state = match &ds {
        Some(ds) => {
            let st = ds.status.clone().unwrap_or_default();
            if st.number_ready >= 1 {
                return Ok(ProbeResult {
                    found: true,
                    flock: true,
                    reason: format!(
                        "DaemonSet {}/{} has {}/{} pods ready",
                        agent.namespace, agent.name, st.number_ready, st.desired_number_scheduled
                    ),
                });
            }
            format!("DaemonSet {}/{} has no ready pod", agent.namespace, agent.name)
        }
        None => format!("no DaemonSet {}/{}", agent.namespace, agent.name),
    };
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system");
    for (name, selector) in OTHER_ENFORCERS {
        let found = pods
            .list(&ListParams::default().labels(selector).limit(1))
            .await
            .map_err(|error| ProbeError::Pods { selector: selector.to_string(), error })?;
        if !found.items.is_empty() {
            return Ok(ProbeResult {
                found: true,
                flock: false,
                reason: format!("{agent_state}; found {name} pods (kube-system, {selector})"),
            });
        }
    }
    let searched: Vec<&str> = OTHER_ENFORCERS.iter().map(|(_, s)| *s).collect();
    Ok(ProbeResult {
        found: false,
        flock: false,
        reason: format!("{agent_state}, and no kube-system pods with {}: NetworkPolicies would not be enforced", searched.join(", ")),
    })
}

/// Whether runs' `Enforced` can be verified: only flock-agent reports what each node
/// enforces (FlockNodes). Not with enforcement off, CiliumNetworkPolicies, an enforcer the
/// auto probe found that is not flock, or where the FlockNode API is not served (flock-agent,
/// which installs it, is not there).
pub(crate) async fn verification(client: &Client, decision: &Decision, kind: &PolicyKind, probe: Option<&ProbeResult>) -> Verify {
    use super::enforced::reason;
    if !decision.enabled {
        return Verify::Unknown { reason: reason::DISABLED, message: format!("policy enforcement is off ({})", decision.reason) };
    }
    if let PolicyKind::Cilium(_) = kind {
        return Verify::Unknown {
            reason: reason::NOT_FLOCK,
            message: "runs get CiliumNetworkPolicies, which Cilium enforces; only flock-agent reports what each node enforces".into(),
        };
    }
    if let Some(p) = probe.filter(|p| !p.flock) {
        return Verify::Unknown { reason: reason::NOT_FLOCK, message: format!("the enforcer is not flock-agent ({})", p.reason) };
    }
    let gvk = GroupVersionKind::gvk(crate::crd::GROUP, crate::crd::VERSION, "FlockNode");
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(_) => Verify::Flock,
        Err(e) => Verify::Unknown {
            reason: reason::NOT_FLOCK,
            message: format!("the FlockNode API (flocknodes.flock.dev, installed with flock-agent) is not served: {e}"),
        },
    }
}

/// Which policy kind runs get.
#[derive(Debug, Clone)]
pub(crate) enum PolicyKind {
    NetworkPolicy,
    /// `cilium.io/v2` CiliumNetworkPolicy, served by the cluster.
    Cilium(ApiResource),
}

impl PolicyKind {
    pub(crate) fn api_version(&self) -> &str {
        match self {
            Self::NetworkPolicy => "networking.k8s.io/v1",
            Self::Cilium(_) => super::CILIUM_API_VERSION,
        }
    }

    pub(crate) fn kind(&self) -> &str {
        match self {
            Self::NetworkPolicy => "NetworkPolicy",
            Self::Cilium(_) => CILIUM_KIND,
        }
    }
}

/// CiliumNetworkPolicy where the API server serves it. A discovery error other than "not
/// served" is logged and falls back to NetworkPolicy (Cilium enforces those too).
pub(crate) async fn policy_kind(client: &Client) -> PolicyKind {
    let gvk = GroupVersionKind::gvk(CILIUM_GROUP, CILIUM_VERSION, CILIUM_KIND);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, _)) => PolicyKind::Cilium(ar),
        Err(kube::Error::Api(s)) if s.code == 404 => PolicyKind::NetworkPolicy,
        Err(kube::Error::Discovery(e)) => {
            tracing::debug!(error = %e, "cilium.io/v2 serves no CiliumNetworkPolicy");
            PolicyKind::NetworkPolicy
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether cilium.io/v2 is served; emitting NetworkPolicies");
            PolicyKind::NetworkPolicy
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!("auto".parse::<EnforceMode>(), Ok(EnforceMode::Auto));
        assert_eq!("".parse::<EnforceMode>(), Ok(EnforceMode::Auto));
        assert_eq!("on".parse::<EnforceMode>(), Ok(EnforceMode::On));
        assert_eq!("off".parse::<EnforceMode>(), Ok(EnforceMode::Off));
        for bad in ["yes", "ON", "true", "enforce"] {
            assert!(bad.parse::<EnforceMode>().is_err(), "{bad}");
        }
    }

    #[test]
    fn decision_table() {
        let yes: Result<ProbeResult, ProbeError> = Ok(ProbeResult { found: true, flock: true, reason: "agent".into() });
        let no: Result<ProbeResult, ProbeError> = Ok(ProbeResult { found: false, flock: false, reason: "none".into() });
        let err: Result<ProbeResult, ProbeError> = Err(ProbeError::Pods {
            selector: "x".into(),
            error: kube::Error::Api(Box::new(kube::core::Status::failure("no", "Forbidden"))),
        });
        let d = |m, p| decide(m, p).enabled;
        assert!(d(EnforceMode::On, None) && d(EnforceMode::On, Some(&no)));
        assert!(!d(EnforceMode::Off, Some(&yes)), "an explicit off wins over the probe");
        assert!(d(EnforceMode::Auto, Some(&yes)));
        assert!(!d(EnforceMode::Auto, Some(&no)));
        assert!(!d(EnforceMode::Auto, Some(&err)), "a probe error means off");
        assert!(decide(EnforceMode::Auto, Some(&err)).reason.contains("probe failed"));
    }
}
