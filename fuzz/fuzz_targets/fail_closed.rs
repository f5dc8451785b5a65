//! Valid policies plus one the API server would reject → the whole pipeline and the packet
//! tracer: the rejected policy isolates what it would select and allows nothing beyond its
//! own valid rules (`flock::fuzzing::fail_closed`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    flock::fuzzing::fail_closed(data);
});
