#!/usr/bin/env bash
# Every gate, in the order a reviewer would: format, lints, tests (unit, conformance on every
# backend, multi-process shm, simulator), docs. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

step() { echo; echo "==> $*"; }
step "format";  cargo fmt --all -- --check
step "lints";   cargo clippy --workspace --all-targets --locked -- -D warnings
step "build";   cargo build --workspace --all-targets --locked
step "tests";   cargo test --workspace --locked
step "docs";    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
step "all gates passed"
