#!/usr/bin/env bash
# The main job: builds microrep and runs a local 3-replica Mu cluster (one process per replica,
# shm fabric) with a demo workload. Extra arguments go to `microrep cluster up`
# (e.g. --kill-leader, --entries N, --replicas 5).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --locked -p microrep-cli --quiet
exec target/release/microrep cluster up "$@"
