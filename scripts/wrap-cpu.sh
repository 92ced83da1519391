#!/usr/bin/env bash
# CPU per request of a wrapped redis-server, by thread name, summed over the replicas: starts
# `microrep wrap --replicas N -- redis-server`, reads utime + stime of every thread of every
# microrep and redis-server process from /proc, runs redis-benchmark (SETs of 64 B on 100,000
# random keys), reads them again. docs/BENCHMARKS.md, "The wrap path's CPU per request".
#
#   scripts/wrap-cpu.sh [--binary PATH] [--connections N] [--requests N] [--replicas N] [--port P]
#
# --binary runs a given build (its shim, libmicrorep_interpose.so, next to it); default: this
# tree's release build. Loopback only; the cluster and its scratch directory are removed at exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BINARY=""
CONNS=32
REQUESTS=40000
REPLICAS=3
PORT=28480
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) BINARY=$2; shift ;;
        --connections) CONNS=$2; shift ;;
        --requests) REQUESTS=$2; shift ;;
        --replicas) REPLICAS=$2; shift ;;
        --port) PORT=$2; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "wrap-cpu: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for n in "$CONNS" "$REQUESTS" "$REPLICAS" "$PORT"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "wrap-cpu: $n is not a positive number" >&2; exit 2; }
done
for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "wrap-cpu: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
if [ -z "$BINARY" ]; then
    (cd "$ROOT" && cargo build --release --quiet -p microrep-cli -p microrep-interpose)
    BINARY=${CARGO_TARGET_DIR:-$ROOT/target}/release/microrep
fi
[ -x "$BINARY" ] && [ -f "$(dirname "$BINARY")/libmicrorep_interpose.so" ] ||
    { echo "wrap-cpu: $BINARY is not an executable with libmicrorep_interpose.so beside it" >&2; exit 2; }

DIR=$(mktemp -d "${TMPDIR:-/tmp}/wrap-cpu.XXXXXX")
WRAP=""
cleanup() {
    if [ -n "$WRAP" ]; then kill "$WRAP" 2>/dev/null || true; wait "$WRAP" 2>/dev/null || true; fi
    rm -rf "$DIR"
}
trap cleanup EXIT

# Clock ticks of CPU (utime + stime) per thread name, over the wrap's processes.
snapshot() {
    for task in /proc/[0-9]*/task/[0-9]*; do
        name=$(cat "$task/comm" 2>/dev/null) || continue
        case "$name" in
            wrap-*|microrep*|redis-server) awk -v n="$name" '{ print n, $14 + $15 }' "$task/stat" 2>/dev/null || true ;;
        esac
    done | awk '{ s[$1] += $2 } END { for (k in s) print k, s[k] }' | sort
}

"$BINARY" wrap --replicas "$REPLICAS" --base-port "$PORT" --dir "$DIR/wrap" -- \
    redis-server --port '{port}' --save '' --appendonly no > "$DIR/wrap.out" 2>&1 &
WRAP=$!
for _ in $(seq 1 300); do
    [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
done
[ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = PONG ] || { echo "wrap-cpu: the leader did not answer"; cat "$DIR/wrap.out"; exit 1; }
TICK=$(getconf CLK_TCK)
snapshot > "$DIR/before"
redis-benchmark -p "$PORT" -c "$CONNS" -n "$REQUESTS" -r 100000 -d 64 -t set --precision 3 > "$DIR/bench" 2>&1 || true
snapshot > "$DIR/after"
tr '\r' '\n' < "$DIR/bench" | awk -v c="$CONNS" -v errors="$(grep -ci error "$DIR/bench" || true)" '
    /throughput summary:/ { rps = $3 }
    /avg       min       p50/ { getline; p50 = $3; p99 = $5 }
    END { printf "connections %s: %s SET/s, p50 %s ms, p99 %s ms, error lines %s\n", c, rps, p50, p99, errors }'
join "$DIR/before" "$DIR/after" | awk -v n="$REQUESTS" -v tick="$TICK" \
    '{ printf "  %-16s %8.1f us/req\n", $1, ($3 - $2) * 1e6 / tick / n }'
