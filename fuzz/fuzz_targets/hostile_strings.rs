//! Hostile strings in names, labels, annotations, port names and policy fields never change
//! the structure of the rendered script.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::hostile_strings(data);
});
