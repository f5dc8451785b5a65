//! A cluster and the node's endpoints changed step by step: after each step the incremental
//! translator and render cache agree with the full translation and render.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::incremental(data);
});
