//! `pipeline` with every check (the second render, the in-memory nft) on every input, not a
//! sample: run it over the pipeline corpus (`cargo fuzz run pipeline_full fuzz/corpus/pipeline`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::pipeline_full(data);
});
