//! Manifest bytes → parse → snapshot → translate and render for every node: no panic, and
//! every script parses back to exactly the rendered objects.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::manifest(data);
});
