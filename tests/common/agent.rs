//! The pods and CNI requests the agent's socket tests share: a running pod `default/<name>`
//! on node `n1` with uid `uid-<name>`, and the ADD its runtime would send.

#![allow(dead_code)]

use flock::model::{Pod, PodPhase};
use flock_cni::protocol::{AddRequest, PodIdentity, Request};

/// A running pod `default/<name>` on node `n1` at `ip`, no labels.
pub fn pod(name: &str, ip: &str) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: Default::default(),
        node: Some("n1".into()),
        phase: PodPhase::Running,
        ips: vec![ip.parse().unwrap()],
        host_network: false,
        ports: vec![],
        created: None,
        unpublished: false,
    }
}

/// The ADD of [`pod`]'s sandbox `cid-<name>`, its interface `eth0`.
pub fn add(name: &str, ip: &str) -> Request {
    let cid = format!("cid-{name}");
    Request::Add(AddRequest {
        host_interface: flock_cni::host_interface_name(&cid, "eth0"),
        container_id: cid,
        ifname: "eth0".into(),
        netns: "/run/netns/none".into(),
        pod: PodIdentity { namespace: "default".into(), name: name.into(), uid: Some(format!("uid-{name}")) },
        ips: vec![ip.parse().unwrap()],
    })
}
