#!/usr/bin/env bash
# What an idle cluster costs (issue 14, docs/BENCHMARKS.md "An idle node's CPU"): starts
# `microrep cluster up --serve --ops 0` (3 nodes, no client), waits for it to settle, then
# reads every node thread's CPU time (utime + stime) and voluntary context switches from /proc
# twice, SECONDS apart, and prints each thread kind's share of a core and wake-ups per second,
# averaged over the nodes. Per-thread times come from /proc in clock ticks (10 ms each, so a
# thread's share is only good to about 0.05% of a core over 20 s); the node's total is also read
# from its process CPU clock (clock_gettime, nanoseconds), which is the figure to quote. If
# redis-server is installed, an idle one (no persistence) is measured in the same window, as
# the anchor. The cluster (and redis-server) are stopped afterwards.
#
#   scripts/idle-cpu.sh [--binary target/release/microrep] [--seconds 20] [--port 16500]
#                       [--set KEY=VALUE]...     (passed to `cluster up`, e.g.
#                                                 --set cluster.timing.idle_heartbeat_us=32000)
set -euo pipefail
cd "$(dirname "$0")/.."

BINARY=target/release/microrep
SECONDS_MEASURED=20
PORT=16500
SETS=()
while [ $# -gt 0 ]; do
    case "$1" in --binary|--seconds|--port|--set)
        [ $# -ge 2 ] || { echo "idle-cpu: $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
        --binary) BINARY=$2; shift ;;
        --seconds) SECONDS_MEASURED=$2; shift ;;
        --port) PORT=$2; shift ;;
        --set) SETS+=(--set "$2"); shift ;;
        *) echo "usage: $0 [--binary PATH] [--seconds N] [--port P] [--set KEY=VALUE]..." >&2; exit 2 ;;
    esac
    shift
done
[[ $SECONDS_MEASURED =~ ^[1-9][0-9]*$ ]] || { echo "idle-cpu: --seconds takes a positive whole number, not '$SECONDS_MEASURED'" >&2; exit 2; }
[[ $PORT =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65000 ] ||
    { echo "idle-cpu: --port takes a port from 1024 to 65000, not '$PORT'" >&2; exit 2; }
[ -x "$BINARY" ] || { echo "idle-cpu: $BINARY not found (cargo build --release -p microrep-cli)" >&2; exit 2; }

log=$(mktemp)
"$BINARY" cluster up --serve --ops 0 --base-port "$PORT" "${SETS[@]}" >"$log" 2>&1 &
cluster=$!
redis=
if command -v redis-server >/dev/null; then
    redis-server --port $((PORT + 50)) --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
    redis=$!
fi
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; [ -z "$redis" ] || { kill $redis; wait $redis; } 2>/dev/null; rm -f "$log"' EXIT

# Settled: three node processes, each with its background thread, and a leader announced.
for _ in $(seq 1 100); do
    nodes=$(pgrep -P "$cluster" || true)
    [ "$(echo "$nodes" | wc -w)" -eq 3 ] && grep -q "leader" "$log" && break
    sleep 0.1
done
[ "$(echo "$nodes" | wc -w)" -eq 3 ] || { echo "idle-cpu: the cluster did not start:" >&2; cat "$log" >&2; exit 1; }
sleep 3

snapshot() {
    for p in $nodes; do
        for t in /proc/"$p"/task/*; do
            printf '%s %s %s\n' "$(cat "$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")" \
                "$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status")"
        done
    done
}
# The CPU time in nanoseconds of the processes given, summed: each process's CPU-time clock
# (clockid (~pid << 3) | 2, CPUCLOCK_SCHED of the whole process), which counts every thread
# exactly.
cpu_ns() {
    python3 -c 'import sys, time; print(sum(int(time.clock_gettime((~int(p) << 3) | 2) * 1e9) for p in sys.argv[1:]))' "$@"
}
before=$(snapshot)
before_ns=$(cpu_ns $nodes)
[ -z "$redis" ] || redis_before_ns=$(cpu_ns $redis)
sleep "$SECONDS_MEASURED"
after_ns=$(cpu_ns $nodes)
[ -z "$redis" ] || redis_after_ns=$(cpu_ns $redis)
after=$(snapshot)

hz=$(getconf CLK_TCK)
echo "idle cluster of 3 nodes, $SECONDS_MEASURED s, ${SETS[*]:-defaults}, load average before: $(cut -d' ' -f1 /proc/loadavg)"
paste <(echo "$before") <(echo "$after") | awk -v s="$SECONDS_MEASURED" -v hz="$hz" '
    { cpu[$1] += ($5 - $2) / hz / s * 100; wake[$1] += ($6 - $3) / s; n[$1]++ }
    END { for (k in cpu) printf "%-18s %6.2f%% of a core per node  %7d wake-ups/s per node\n", k, cpu[k] / 3, wake[k] / 3 }' |
    sort
awk -v b="$before_ns" -v a="$after_ns" -v s="$SECONDS_MEASURED" \
    'BEGIN { printf "node (process clock) %6.3f%% of a core per node\n", (a - b) / 3 / (s * 1e9) * 100 }'
[ -z "$redis" ] || awk -v b="$redis_before_ns" -v a="$redis_after_ns" -v s="$SECONDS_MEASURED" \
    'BEGIN { printf "idle redis-server    %6.3f%% of a core (same window)\n", (a - b) / (s * 1e9) * 100 }'
