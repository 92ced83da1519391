#!/usr/bin/env bash
# The main job: builds microrep and runs its demo on the default (shm) fabric.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --locked -p microrep-cli --quiet
exec target/release/microrep demo "$@"
