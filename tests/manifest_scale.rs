//! Writes the synthetic cluster of `flockctl bench` ([`flock::synth`]) as a manifest file, for
//! timing `flockctl render` on a cluster of the design's size (150,000 pods, 10,000 policies):
//!
//! ```text
//! FLOCK_MANIFEST_OUT=/tmp/cluster.yaml cargo test --release --test manifest_scale -- --ignored
//! /usr/bin/time -v target/release/flockctl render --manifests /tmp/cluster.yaml --node node-0 >/dev/null
//! ```
//!
//! `FLOCK_MANIFEST_PODS` and `FLOCK_MANIFEST_POLICIES` change the size. The file is one
//! flow-style document per object ([`flock::fuzzing::to_manifest`]), read back to the same
//! snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use flock::fuzzing::to_manifest;
use flock::model::manifest::Object;
use flock::synth::{self, Params};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().unwrap())
}

#[test]
#[ignore = "writes a large file; run by hand for measurements"]
fn write_synthetic_manifest() {
    let out = std::env::var("FLOCK_MANIFEST_OUT").expect("FLOCK_MANIFEST_OUT=path of the manifest to write");
    let params = Params::new(env_usize("FLOCK_MANIFEST_PODS", 150_000), env_usize("FLOCK_MANIFEST_POLICIES", 10_000));
    let s = synth::generate(&params).snapshot;
    let objects: Vec<Object> = s
        .nodes()
        .cloned()
        .map(Object::Node)
        .chain(s.namespaces().cloned().map(Object::Namespace))
        .chain(s.pods().cloned().map(Object::Pod))
        .chain(s.policies().cloned().map(Object::NetworkPolicy))
        .collect();
    std::fs::write(&out, to_manifest(&objects, &BTreeMap::new())).unwrap();
    eprintln!("wrote {} objects ({} pods) to {out}", objects.len(), s.pod_count());
}
