//! cargo-fuzz target: the checks of `microrep_fabric::fuzzing::verbs_bootstrap` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| microrep_fabric::fuzzing::verbs_bootstrap(data));
