//! Any bytes as a resolver's response to one of a few queries → what the answer teaches:
//! never a panic, and only addresses the response holds for the asked name or its CNAME chain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::dns_answer(data);
});
