//! cargo-fuzz target: the checks of `microrep_fabric::fuzzing::tcp_frames` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| microrep_fabric::fuzzing::tcp_frames(data));
