#!/usr/bin/env bash
# The main job: builds microrep and runs a local 3-replica key-value cluster (one `microrep node`
# process per replica, shm fabric) with a demo load. Extra arguments go to `microrep cluster up`
# (e.g. --kill-leader, --serve, --ops N, --replicas 5).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --locked -p microrep-cli --quiet
exec target/release/microrep cluster up "$@"
