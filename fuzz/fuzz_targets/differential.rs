//! Random clusters with NetworkPolicies and ClusterNetworkPolicies → the enforced rulesets
//! through the packet tracer, flow by flow against the reference evaluator read from the API
//! text (`flock::fuzzing::differential`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::differential(data);
});
