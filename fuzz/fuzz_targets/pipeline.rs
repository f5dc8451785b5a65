//! An arbitrary snapshot, policies and endpoints → translate → render: no panic, equal input
//! gives equal bytes, and the script parses back to exactly the rendered objects.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::pipeline(data);
});
