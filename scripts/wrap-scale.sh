#!/usr/bin/env bash
# A wrapped redis-server at growing group sizes (issue 20 §4, docs/BENCHMARKS.md "Wrapped
# redis-server at scale"): for each size, `microrep wrap --replicas N`, then redis-benchmark SETs
# against the leader at 1 and 64 connections (p50/p99/p99.9 from redis-benchmark's
# HdrHistogram, failed requests counted), and the CPU time each process spent per request
# during the 1-connection run (from /proc: the leader's wrap node, the leader's server, and all
# followers' wrap nodes and servers together). Then, at the smallest size, latency over 1 to 64
# connections. Beside each row, the consensus latency of the inputs the leader committed during
# it (FALCON's measure): from the leader's `microrep_commit_latency_seconds` histogram
# (`--metrics-base-port`), scraped before and after, as the upper bounds of the buckets holding
# p50/p99/p99.9 (two per octave), with the mean from the exact sum. First, the same loads against
# a plain redis-server (the baseline, in the same run). Every cluster is stopped before the next
# starts; nothing is left behind.
#
#   scripts/wrap-scale.sh [--sizes 3,5,9,33,105] [--requests 20000] [--port 30000] [--binary PATH]
#
# --binary runs a given build (its shim, libmicrorep_interpose.so, next to it) instead of
# building this tree: two builds side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

SIZES=3,5,9,33,105
REQUESTS=20000
PORT=30000
BINARY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) SIZES=$2; shift ;;
        --requests) REQUESTS=$2; shift ;;
        --port) PORT=$2; shift ;;
        --binary) BINARY=$2; shift ;;
        *) echo "usage: $0 [--sizes 3,5,9,33,105] [--requests N] [--port P] [--binary PATH]" >&2; exit 2 ;;
    esac
    shift
done
for tool in redis-server redis-benchmark redis-cli curl; do
    command -v "$tool" >/dev/null || { echo "wrap-scale: $tool is not installed (apt-get install redis-server redis-tools)" >&2; exit 2; }
done

if [ -n "$BINARY" ]; then
    [ -x "$BINARY" ] && [ -f "$(dirname "$BINARY")/libmicrorep_interpose.so" ] ||
        { echo "wrap-scale: $BINARY is not an executable with libmicrorep_interpose.so beside it" >&2; exit 2; }
    MICROREP=$BINARY
else
    echo "== building microrep and the shim (release)"
    nice -n 10 cargo build --release --locked -p microrep-cli -p microrep-interpose --quiet
    MICROREP=${CARGO_TARGET_DIR:-target}/release/microrep
fi
# Replica i serves its metrics on METRICS + i, clear of the servers' ports (PORT + i).
METRICS=$((PORT + 1000))
[ $((METRICS + 500)) -le 65535 ] || { echo "wrap-scale: --port $PORT leaves no room for the metrics ports" >&2; exit 2; }
WORK=$(mktemp -d /dev/shm/wrap-scale.XXXXXX)
WRAP_PID=""
PLAIN_PID=""
stop_plain() {
    if [ -n "$PLAIN_PID" ]; then
        kill -TERM "$PLAIN_PID" 2>/dev/null || true
        wait "$PLAIN_PID" 2>/dev/null || true
        PLAIN_PID=""
    fi
}
stop_wrap() {
    if [ -n "$WRAP_PID" ]; then
        kill -TERM "$WRAP_PID" 2>/dev/null || true
        for _ in $(seq 1 300); do kill -0 "$WRAP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$WRAP_PID" 2>/dev/null || true
        wait "$WRAP_PID" 2>/dev/null || true
        WRAP_PID=""
    fi
}
trap 'stop_plain; stop_wrap; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

start_wrap() { # replicas; sets LEADER (a port)
    local n=$1
    rm -rf "$WORK/wrap"; mkdir -p "$WORK/wrap"
    "$MICROREP" wrap --replicas "$n" --base-port "$PORT" --metrics-base-port "$METRICS" --dir "$WORK/wrap" -- \
        redis-server --port '{port}' --bind 127.0.0.1 --save '' --appendonly no > "$WORK/wrap-$n.out" 2>&1 &
    WRAP_PID=$!
    LEADER=""
    for _ in $(seq 1 1800); do
        for p in $(seq "$PORT" $((PORT + n - 1))); do
            if [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then LEADER=$p; return 0; fi
        done
        kill -0 "$WRAP_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "wrap-scale: no leader of $n replicas answered (wrap exited, or 180 s passed)" >&2
    tail -20 "$WORK/wrap-$n.out" >&2
    return 1
}

cpu_ticks() { # pids...: utime + stime, in clock ticks, summed
    local total=0 pid
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}

# The wrap-replica process serving port $1, and its server's pid.
replica_pids() { pgrep -f "wrap-replica .*--port $1( |$)" | head -1; }
server_pid() { pgrep -f "redis-server 127.0.0.1:$1\$" | head -1; }

bench() { # connections: one markdown row fragment "requests/s | p50 | p99 | p99.9 | failed"
    local out=$WORK/bench.txt
    # Bounded: requests not completed in 10 minutes count as failed.
    timeout 600 redis-benchmark -h 127.0.0.1 -p "$LEADER" -c "$1" -n "$REQUESTS" -r 100000 -d 64 -t set \
        --precision 3 > "$out" 2>&1 || true
    tr '\r' '\n' < "$out" | awk -v errors="$(grep -ci error "$out" || true)" -v asked="$REQUESTS" '
        /% <= / && !done999 { pct = $1; sub("%", "", pct); if (pct + 0 >= 99.9) { p999 = $3; done999 = 1 } }
        /throughput summary:/ { rps = $3 }
        /requests completed in/ { completed = $1 }
        /avg       min       p50/ { getline; p50 = $3; p99 = $5 }
        END { printf "%.0f | %s | %s | %s | %d", rps, p50, p99, p999, asked - completed + errors }'
}

# The leader's commit latency histogram: "le count" lines (cumulative), then "sum S" and "count N".
scrape_latency() {
    curl -sf --max-time 10 "http://127.0.0.1:$((METRICS + LEADER - PORT))/metrics" | awk '
        /^microrep_commit_latency_seconds_bucket/ { split($1, a, "\""); print a[2], $2 }
        /^microrep_commit_latency_seconds_sum/ { print "sum", $2 }
        /^microrep_commit_latency_seconds_count/ { print "count", $2 }' || true
}

# Consensus latency between two scrapes (files): "p50 | p99 | p99.9 | mean | entries", in us.
consensus() {
    [ -s "$1" ] && [ -s "$2" ] || { echo "- | - | - | - | 0"; return; }
    awk 'FNR == NR { before[$1] = $2; next }
        { d = $2 - before[$1] }
        $1 == "sum" { sum = d; next }
        $1 == "count" { count = d; next }
        { le[++n] = $1; cum[n] = d }
        END {
            if (count <= 0) { printf "- | - | - | - | 0"; exit }
            split("0.5 0.99 0.999", q, " ")
            for (k = 1; k <= 3; k++)
                for (i = 1; i <= n; i++)
                    if (cum[i] >= q[k] * count) { p[k] = (le[i] == "+Inf") ? "inf" : sprintf("%g", le[i] * 1e6); break }
            printf "%s | %s | %s | %.1f | %d", p[1], p[2], p[3], sum / count * 1e6, count
        }' "$1" "$2"
}

# One row's fragment: the redis-benchmark columns, then the consensus columns.
measured() { # connections
    scrape_latency > "$WORK/latency.before"
    local row; row=$(bench "$1")
    scrape_latency > "$WORK/latency.after"
    echo "$row | $(consensus "$WORK/latency.before" "$WORK/latency.after")"
}

HZ=$(getconf CLK_TCK)
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "| replicas | connections | SET/s | p50 ms | p99 ms | p99.9 ms (<=) | failed | consensus p50 us (<=) | p99 us (<=) | p99.9 us (<=) | mean us | entries | leader node CPU us/req | leader server CPU us/req | followers' CPU us/req |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# The baseline: a plain redis-server (no shim, no replicas) on METRICS + 500, at every load.
LEADER=$((METRICS + 500))
redis-server --port "$LEADER" --bind 127.0.0.1 --save '' --appendonly no > "$WORK/plain.out" 2>&1 &
PLAIN_PID=$!
for _ in $(seq 1 100); do [ "$(redis-cli -p "$LEADER" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
for c in 1 64 2 4 8 16 32; do echo "| plain | $c | $(bench "$c") | | | | | | | | |"; done
stop_plain
IFS=, read -ra sizes <<< "$SIZES"
for n in "${sizes[@]}"; do
    start_wrap "$n" || { stop_wrap; continue; }
    node=$(replica_pids "$LEADER"); server=$(server_pid "$LEADER")
    others=()
    for p in $(seq "$PORT" $((PORT + n - 1))); do
        [ "$p" = "$LEADER" ] && continue
        others+=("$(replica_pids "$p")" "$(server_pid "$p")")
    done
    before=("$(cpu_ticks "$node")" "$(cpu_ticks "$server")" "$(cpu_ticks "${others[@]}")")
    row=$(measured 1)
    after=("$(cpu_ticks "$node")" "$(cpu_ticks "$server")" "$(cpu_ticks "${others[@]}")")
    per() { awk -v d="$(( $2 - $1 ))" -v hz="$HZ" -v n="$REQUESTS" 'BEGIN { printf "%.1f", d / hz * 1e6 / n }'; }
    echo "| $n | 1 | $row | $(per "${before[0]}" "${after[0]}") | $(per "${before[1]}" "${after[1]}") | $(per "${before[2]}" "${after[2]}") |"
    echo "| $n | 64 | $(measured 64) | | | |"
    if [ "$n" = "${sizes[0]}" ]; then
        for c in 2 4 8 16 32; do echo "| $n | $c | $(measured "$c") | | | |"; done
    fi
    stop_wrap
done
