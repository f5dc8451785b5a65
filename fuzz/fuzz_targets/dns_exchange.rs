//! A pod's query rewritten for the resolver and any bytes as the answer → the DNS proxy's
//! matching: never a panic, only the answer to the rewritten query (its id, its question byte
//! for byte) accepted, and the pod's own id and question given back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::dns_exchange(data);
});
