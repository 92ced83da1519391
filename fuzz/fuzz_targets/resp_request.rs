//! cargo-fuzz target: the checks of `microrep_kv::fuzzing::resp_request` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| microrep_kv::fuzzing::resp_request(data));
