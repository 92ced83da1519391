#!/usr/bin/env bash
# microrep next to etcd (docs/BENCHMARKS.md): builds the release `microrep` and the Go load
# generator tools/etcdbench, then runs `microrep bench etcd ARGS...`, which starts 3 etcd members
# and 3 microrep replicas on 127.0.0.1 and times replicated writes of both in one run, with every
# client at the leader and with clients spread over every member.
#
#   scripts/bench-etcd.sh                              8 clients, 256 B, 10,000 requests, shm and tcp
#   scripts/bench-etcd.sh --clients 1 --value 64 --json
#   scripts/bench-etcd.sh --etcd-dir /dev/shm          etcd's log on tmpfs (no disk fsync)
#
# Needs etcd-server (apt; scripts/setup.sh installs it) and Go >= 1.22.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
export PATH="$PATH:/usr/local/go/bin"
for tool in go etcd; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench-etcd: '$tool' is not on PATH (scripts/setup.sh installs etcd-server and Go)" >&2
    exit 2
  fi
done
nice -n 10 cargo build --release --locked -p microrep-cli --quiet
target=${CARGO_TARGET_DIR:-$PWD/target}
mkdir -p "$target"
(cd tools/etcdbench && nice -n 10 go build -o "$target/etcdbench" .)
exec "$target/release/microrep" bench etcd --etcdbench "$target/etcdbench" "$@"
