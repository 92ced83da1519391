#!/usr/bin/env bash
# Fuzzes every decoder that takes bytes from peers or clients with cargo-fuzz (libFuzzer), each
# for FUZZ_SECONDS (default 60): the tcp frame decoder, the verbs bootstrap decoders, the Mu slot
# decoder, the RESP request parser and the RESP client's reply parser. The checks themselves live
# in the crates (`fuzzing` modules) and also run as property tests in the default `cargo test`.
#
# libFuzzer needs nightly compiler flags; RUSTC_BOOTSTRAP=1 lets the installed stable toolchain
# accept them. A crash leaves its input in fuzz/artifacts/<target>/: turn it into a regression
# test beside the decoder, then fix the decoder. Prints each target's corpus size and executions
# (record them in docs/RELIABILITY.md).
#
# Usage: scripts/fuzz.sh [target...]   (default: all five)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz@0.13.2
export RUSTC_BOOTSTRAP=1
seconds="${FUZZ_SECONDS:-60}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tcp_frames verbs_bootstrap mu_slot resp_request resp_reply)
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  log="fuzz/target/$target.log"
  mkdir -p fuzz/target
  echo "==> $target: ${seconds}s"
  cargo fuzz run --fuzz-dir fuzz "$target" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || {
    tail -40 "$log"
    echo "FAILED: $target (input in fuzz/artifacts/$target/)"
    exit 1
  }
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  echo "$target: $runs executions, corpus of $(find "fuzz/corpus/$target" -type f | wc -l) inputs"
done
