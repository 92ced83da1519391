//! cargo-fuzz target: the checks of `microrep_kv::fuzzing::resp_reply` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| microrep_kv::fuzzing::resp_reply(data));
