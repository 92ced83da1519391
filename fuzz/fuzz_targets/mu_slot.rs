//! cargo-fuzz target: the checks of `microrep_core::fuzzing::mu_slot` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| microrep_core::fuzzing::mu_slot(data));
