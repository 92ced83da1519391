#!/usr/bin/env bash
# memcached (Debian's 1.6.18) through `microrep wrap`, next to a plain memcached, in one run:
# pymemcache's integration tests (Debian's python3-pymemcache 3.5.2, its TLS tests left out),
# libmemcached's protocol conformance tests (memccapable: text and binary), memcached-tool
# stats and dump, loads (memcslap sets and gets, memaslap for 10 s), and three connections
# pipelining appends to the same keys at once (the values record the order the leader served
# them in). Both run `-t 1 -R 100000` (docs/WRAP.md says why). Then every wrapped
# copy's items are read directly over UDP (`-U {port}`: the shim does not interpose UDP) and
# compared: value, flags and CAS token of every item without expiry. Fails if a test that
# passes plain does not pass wrapped, if a tool fails wrapped, or if the copies differ.
# docs/WRAP.md.
#
#   scripts/memcached-suite.sh            # about 1 to 2 minutes
#   options: --port P (plain memcached on P, wrapped copies on P+1..P+3; default 31211)
#            --requests N (memcslap operations per test and thread; default 2000)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PORT=31211
REQUESTS=2000
while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT=$2; shift ;;
        --requests) REQUESTS=$2; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "memcached-suite: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

packages=(memcached libmemcached-tools python3-pymemcache python3-pytest)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "== installing ${missing[*]}"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
PYTHON=/usr/bin/python3 # Debian's, which has python3-pymemcache (not a pyenv or venv one)
TESTS=$($PYTHON -c 'import os, pymemcache.test as t; print(os.path.dirname(t.__file__))')
TOOL=/usr/share/memcached/scripts/memcached-tool

echo "== building microrep and the shim (release)"
(cd "$ROOT" && cargo build --release --quiet -p microrep-cli -p microrep-interpose)
MICROREP=$TARGET/release/microrep

WORK=$(mktemp -d "${TMPDIR:-/tmp}/memcached-suite.XXXXXX")
PIDS=()
KEEP=1 # until the script reaches its verdict, an early exit keeps the logs
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$KEEP" = 1 ]; then echo "memcached-suite: logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

USER_ARGS=()
[ "$(id -u)" -eq 0 ] && USER_ARGS=(-u root) # memcached refuses to run as root without -u

answers() { # port: whether a memcached serves clients there (followers close connections)
    timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'version\r\n' >&3 && read -r line <&3 \
        && [[ \$line == VERSION* ]]" 2>/dev/null
}

start_plain() {
    memcached "${USER_ARGS[@]}" -t 1 -R 100000 -p "$PORT" -U 0 -l 127.0.0.1 > "$WORK/plain-server.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do answers "$PORT" && return 0; sleep 0.1; done
    echo "memcached-suite: the plain memcached did not answer on port $PORT" >&2
    exit 1
}

BASE=$((PORT + 1))
start_wrap() { # sets LEADER
    mkdir -p "$WORK/wrap"
    "$MICROREP" wrap --replicas 3 --base-port "$BASE" --dir "$WORK/wrap" -- \
        memcached "${USER_ARGS[@]}" -t 1 -R 100000 -p '{port}' -U '{port}' -l 127.0.0.1 > "$WORK/wrap.out" 2>&1 &
    PIDS+=($!)
    LEADER=""
    for _ in $(seq 1 600); do
        for p in $BASE $((BASE + 1)) $((BASE + 2)); do
            if answers "$p"; then LEADER=$p; return 0; fi
        done
        sleep 0.1
    done
    echo "memcached-suite: no wrapped leader answered"
    cat "$WORK/wrap.out"
    exit 1
}

FAILED=0
run_all() { # name port
    local name=$1 port=$2 start=$SECONDS
    echo "== $name: pymemcache's integration tests against 127.0.0.1:$port"
    (cd "$WORK" && timeout 300 $PYTHON -m pytest -p no:cacheprovider -q -rA -W ignore -k "not tls" \
        "$TESTS/test_integration.py" --server 127.0.0.1 --port "$port") > "$WORK/$name-pymemcache.log" 2>&1 || true
    grep '^PASSED ' "$WORK/$name-pymemcache.log" | sed 's/^PASSED //' | sort -u > "$WORK/$name.passed" || true
    printf '%s: pymemcache %s passed, %s failed, %s errors\n' "$name" "$(wc -l < "$WORK/$name.passed")" \
        "$(grep -c '^FAILED ' "$WORK/$name-pymemcache.log" || true)" \
        "$(grep -c '^ERROR ' "$WORK/$name-pymemcache.log" || true)" | tee -a "$WORK/summary"

    echo "== $name: memccapable (text and binary protocol conformance)"
    timeout 300 memccapable -h 127.0.0.1 -p "$port" > "$WORK/$name-capable.log" 2>&1 || true
    sed -n 's/^\(.*[^ ]\) *\[pass\]$/capable: \1/p' "$WORK/$name-capable.log" | sort -u >> "$WORK/$name.passed"
    printf '%s: memccapable %s passed, %s failed, %s skipped\n' "$name" \
        "$(grep -c '\[pass\]' "$WORK/$name-capable.log" || true)" "$(grep -ci '\[fail\]' "$WORK/$name-capable.log" || true)" \
        "$(grep -c '\[skip\]' "$WORK/$name-capable.log" || true)" | tee -a "$WORK/summary"

    echo "== $name: memcached-tool stats and dump"
    if timeout 60 "$TOOL" "127.0.0.1:$port" stats > "$WORK/$name-stats.log" 2>&1 \
        && grep -q curr_items "$WORK/$name-stats.log"; then
        echo "tool: memcached-tool stats" >> "$WORK/$name.passed"
    fi
    if timeout 60 "$TOOL" "127.0.0.1:$port" dump > "$WORK/$name-dump.log" 2> "$WORK/$name-dump.err"; then
        echo "tool: memcached-tool dump" >> "$WORK/$name.passed"
    fi
    printf '%s: memcached-tool stats (%s lines), dump (%s items)\n' "$name" "$(wc -l < "$WORK/$name-stats.log")" \
        "$(grep -c '^add ' "$WORK/$name-dump.log" || true)" | tee -a "$WORK/summary"

    echo "== $name: loads (memcslap set and get, 4 threads x $REQUESTS; memaslap 10 s)"
    for test in set get; do
        local t0=$SECONDS
        if timeout 300 memcslap --servers="127.0.0.1:$port" --concurrency=4 --execute-number="$REQUESTS" \
            --test=$test > "$WORK/$name-memcslap-$test.log" 2>&1; then
            echo "tool: memcslap $test" >> "$WORK/$name.passed"
        fi
        printf '%s: memcslap %s: %s s, exit %s\n' "$name" $test "$((SECONDS - t0))" \
            "$(grep -q "tool: memcslap $test" "$WORK/$name.passed" && echo 0 || echo failed)" | tee -a "$WORK/summary"
    done
    if timeout 60 memcaslap --servers="127.0.0.1:$port" --threads=1 --concurrency=8 --time=10s \
        > "$WORK/$name-memaslap.log" 2>&1; then
        echo "tool: memaslap" >> "$WORK/$name.passed"
    fi
    printf '%s: memaslap %s\n' "$name" "$(grep '^Run time' "$WORK/$name-memaslap.log" | tail -1 || echo failed)" \
        | tee -a "$WORK/summary"
    echo "== $name: three connections pipelining 150 appends each to one key, 10 keys"
    if $PYTHON - "$port" > "$WORK/$name-appends.log" 2>&1 <<'EOF'
import socket, sys, threading

port = int(sys.argv[1])
def call(s, request, replies):
    s.sendall(request)
    got = b""
    while got.count(b"\r\n") < replies:
        chunk = s.recv(1 << 16)
        if not chunk:
            sys.exit("the server closed the connection")
        got += chunk
    return got
main = socket.create_connection(("127.0.0.1", port), timeout=30)
for k in range(10):
    key = b"mixed:%d" % k
    assert call(main, b"set " + key + b" 0 0 1\r\n-\r\n", 1) == b"STORED\r\n"
    def appends(tag):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        batch = b"".join(b"append " + key + b" 0 0 1\r\n" + tag + b"\r\n" for _ in range(150))
        assert call(s, batch, 150) == b"STORED\r\n" * 150
    writers = [threading.Thread(target=appends, args=(t,)) for t in (b"a", b"b", b"c")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    value = call(main, b"get " + key + b"\r\n", 3).split(b"\r\n")[1]
    assert len(value) == 451, value
    print(key.decode(), value.decode())
EOF
    then
        echo "tool: pipelined appends" >> "$WORK/$name.passed"
    fi
    printf '%s: pipelined appends to %s keys\n' "$name" "$(grep -c '^mixed:' "$WORK/$name-appends.log" || true)" \
        | tee -a "$WORK/summary"
    echo "$name: $((SECONDS - start)) s in all" | tee -a "$WORK/summary"
}

start_plain
run_all plain "$PORT"
kill "${PIDS[0]}"

start_wrap
echo "== wrapped leader on port $LEADER"
run_all wrapped "$LEADER"

echo "== every wrapped copy's items without expiry, read over UDP"
compare() {
    $PYTHON - "$LEADER" "$BASE" "$((BASE + 1))" "$((BASE + 2))" <<'EOF'
import hashlib, socket, struct, sys, urllib.parse

leader, ports = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
s = socket.create_connection(("127.0.0.1", leader), timeout=30)
s.sendall(b"lru_crawler metadump all\r\n")
dump = b""
while not dump.endswith(b"END\r\n"):
    chunk = s.recv(1 << 16)
    if not chunk:
        sys.exit("the leader closed the metadump")
    dump += chunk
keys = sorted(
    urllib.parse.unquote(f["key"])
    for f in (dict(x.split("=", 1) for x in line.split()) for line in dump.decode().splitlines() if line.startswith("key="))
    if f["exp"] == "-1"
)

def gets(port, key):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(struct.pack(">HHHH", 1, 0, 1, 0) + b"gets " + key.encode() + b"\r\n", ("127.0.0.1", port))
    parts, total = {}, None
    while total is None or len(parts) < total:
        datagram = u.recv(1 << 16)
        _, seq, total, _ = struct.unpack(">HHHH", datagram[:8])
        parts[seq] = datagram[8:]
    return b"".join(parts[i] for i in range(total))

digests = []
for port in ports:
    h = hashlib.sha256()
    for key in keys:
        h.update(gets(port, key))
    digests.append(h.hexdigest()[:16])
    print(f"  port {port}: {len(keys)} items, sha256 of their gets replies {digests[-1]}")
sys.exit(0 if len(set(digests)) == 1 else 1)
EOF
}
agree=0
for _ in $(seq 1 30); do
    if compare > "$WORK/compare.log" 2>&1; then agree=1; break; fi
    sleep 1
done
cat "$WORK/compare.log"

regressions=$(comm -23 <(sort -u "$WORK/plain.passed") <(sort -u "$WORK/wrapped.passed"))
status=0
if [ -n "$regressions" ]; then
    echo "== passed plain but not wrapped ($(echo "$regressions" | wc -l)):"
    echo "$regressions" | awk 'NR <= 40 { print "  " $0 }'
    status=1
fi
if [ $agree = 0 ]; then
    echo "== the wrapped copies differ"
    status=1
fi
if grep -q "exited\|stopping this copy" "$WORK/wrap.out"; then
    echo "== a wrapped replica exited:"
    grep "exited\|stopping this copy" "$WORK/wrap.out" | head -5
    status=1
fi
echo "== summary"
cat "$WORK/summary"
[ $status = 0 ] && KEEP=0
[ $status = 0 ] && echo "memcached-suite: everything that passed plain passed wrapped; the copies agree"
exit $status
