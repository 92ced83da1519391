#!/usr/bin/env bash
# The verbs backend's CI slice: one command that installs what it needs, builds the soft-RoCE VM
# (scripts/rxe-vm/), builds the test binaries here on the host, and runs inside one VM boot:
#   1. perftest's ib_write_lat on rxe0 (server and client over loopback): the device works;
#   2. the fabric conformance suite on the verbs backend, then crates/fabric/tests/verbs.rs
#      (MICROREP_REQUIRE_RDMA=1: a missing device fails instead of skipping);
#   3. three Mu replicas (threads) over verbs: 3,000 proposals, the leader killed halfway;
#   4. the verbs configuration of a node (crates/runtime/tests/verbs.rs) and the fabric's unit
#      tests (memlock check) with the feature on;
#   5. `microrep cluster up --fabric verbs` (built with --features verbs): three `microrep node`
#      processes of the key-value example over RDMA, 3,000 RESP commands, the leader SIGKILLed
#      halfway; fails unless every acknowledged write reads back and the survivors agree;
#   6. atomic multicast over verbs: three members deliver one order, one stops and the other two
#      run the next view (crates/runtime/tests/multicast_verbs.rs), then
#      `microrep bench multicast --fabric verbs` (3 members, 64 B and 10 KiB, 2 s a point);
#      fails unless every point delivered every message at every member (lost 0);
#   7. with --bench: the verbs latency benchmark next to ib_write_lat / ib_read_lat, and Mu's
#      replication latency over verbs next to ib_write_lat.
# With --multicast: steps 1 and 6 only (a shorter boot for multicast work). With --mu-bench: step 1
# and Mu's replication latency next to ib_write_lat only, with its per-step breakdown of a commit
# (a shorter boot for work on the commit path over verbs).
# Exits non-zero when anything inside fails. Bounded: qemu is killed after VM_TIMEOUT_S (600 s;
# 900 s with --bench).
#
# Usage: scripts/verbs-test.sh [--bench | --multicast | --mu-bench]
# Output: $VM_DIR/run/ (console.log, one log per step); VM_DIR defaults to rxe-vm/ in the cargo
# target directory ($CARGO_TARGET_DIR, else target/), which must not be under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bench=0
all=1
mu_only=0
usage() { echo "usage: $0 [--bench | --multicast | --mu-bench]" >&2; exit 2; }
(($# <= 1)) || usage
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    --multicast) all=0 ;;
    --mu-bench) all=0; mu_only=1 ;;
    *) usage ;;
  esac
done

target_dir=${CARGO_TARGET_DIR:-$repo/target}
mkdir -p "$target_dir"
target_dir=$(cd "$target_dir" && pwd)
export VM_DIR=${VM_DIR:-$target_dir/rxe-vm}

scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
scripts/rxe-vm/build.sh

conformance_bin="" verbs_bin="" fabric_lib_bin="" mu_bin="" node_config_bin="" multicast_bin="" microrep_bin=""
if ((!mu_only)); then
  echo "==> building the verbs test binaries"
  built=$(nice -n 10 cargo test --locked -p microrep-fabric --features verbs --lib --test conformance --test verbs --no-run 2>&1 \
    | tee >(cat >&2) | sed -n -e 's/.*Executable tests\/\([a-z_]*\)\.rs (\(.*\)).*/\1 \2/p' \
    -e 's/.*Executable unittests src\/lib\.rs (\(.*\)).*/lib \1/p')
  conformance_bin=$(awk '$1 == "conformance" {print $2}' <<<"$built")
  verbs_bin=$(awk '$1 == "verbs" {print $2}' <<<"$built")
  fabric_lib_bin=$(awk '$1 == "lib" {print $2}' <<<"$built")
  mu_bin=$(nice -n 10 cargo test --locked -p microrep-core --features verbs --test mu_verbs --no-run 2>&1 \
    | tee >(cat >&2) | sed -n 's/.*Executable tests\/mu_verbs\.rs (\(.*\)).*/\1/p')
  node_config_bin=$(nice -n 10 cargo test --locked -p microrep --features verbs --test verbs --no-run 2>&1 \
    | tee >(cat >&2) | sed -n 's/.*Executable tests\/verbs\.rs (\(.*\)).*/\1/p')
  multicast_bin=$(nice -n 10 cargo test --locked -p microrep --features verbs --test multicast_verbs --no-run 2>&1 \
    | tee >(cat >&2) | sed -n 's/.*Executable tests\/multicast_verbs\.rs (\(.*\)).*/\1/p')
  nice -n 10 cargo build --locked -p microrep-cli --features verbs
  microrep_bin=$target_dir/debug/microrep
  for bin in "$conformance_bin" "$verbs_bin" "$fabric_lib_bin" "$mu_bin" "$node_config_bin" "$multicast_bin" "$microrep_bin"; do
    [ -x "$bin" ] || { echo "verbs-test: test binary ${bin:-(unnamed)} not found" >&2; exit 1; }
  done
fi
bench_bin=""
mu_bench_bin=""
if ((bench)); then
  bench_bin=$(nice -n 10 cargo bench --locked -p microrep-fabric --features verbs --bench verbs_latency --no-run 2>&1 \
    | tee >(cat >&2) | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -n 1)
fi
if ((bench || mu_only)); then
  mu_bench_bin=$(nice -n 10 cargo bench --locked -p microrep-core --features verbs --bench mu_verbs_latency --no-run 2>&1 \
    | tee >(cat >&2) | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -n 1)
  [ -x "$mu_bench_bin" ] && { ((!bench)) || [ -x "$bench_bin" ]; } || { echo "verbs-test: no benchmark binary found" >&2; exit 1; }
fi

out=$VM_DIR/run
rm -rf "$out"; mkdir -p "$out"
cat > "$out/inside.sh" <<INSIDE
set -uo pipefail
out=$out
cd $repo
status=0
step() { echo "==> \$1"; shift; "\$@" > "\$out/\$name.log" 2>&1; rc=\$?; echo "    exit \$rc"; [ \$rc -eq 0 ] || status=1; }
perftest_pair() { # tool, size: server and client on rxe0, RoCE v2 GID index 1, loopback
  timeout -k 5 60 \$1 -d rxe0 -x 1 -s \$2 -n \${3:-1000} > "\$out/\$1-server.log" 2>&1 &
  local server=\$!
  for _ in \$(seq 1 50); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
  timeout -k 5 60 \$1 -d rxe0 -x 1 -s \$2 -n \${3:-1000} 127.0.0.1; local rc=\$?
  wait \$server || rc=1
  return \$rc
}
name=ib_write_lat; step "ib_write_lat (device check)" perftest_pair ib_write_lat 8 200
if [ $all -eq 1 ]; then
name=conformance; step "conformance suite on verbs" env MICROREP_REQUIRE_RDMA=1 RUST_BACKTRACE=1 $conformance_bin --test-threads 1 verbs::
name=verbs; step "verbs permissions, errors, threads" env MICROREP_REQUIRE_RDMA=1 RUST_BACKTRACE=1 $verbs_bin --test-threads 1 --nocapture
name=mu_verbs; step "3 Mu replicas over verbs, leader killed halfway" env MICROREP_REQUIRE_RDMA=1 RUST_BACKTRACE=1 $mu_bin --nocapture
name=verbs-unit; step "verbs node configuration and memlock checks" bash -c "$node_config_bin && $fabric_lib_bin verbs::"
cluster_up() { # the key-value example over verbs from the CLI, with a leader kill
  timeout -k 5 300 $microrep_bin cluster up --fabric verbs --replicas 3 --ops 3000 --clients 4 --kill-leader --base-port 16380 \
    | tee "\$out/cluster-up.out"
  [ "\${PIPESTATUS[0]}" -eq 0 ] && grep -q 'on the verbs fabric' "\$out/cluster-up.out" \
    && grep -q '(SIGKILL)' "\$out/cluster-up.out" && grep -q 'acknowledged writes read back' "\$out/cluster-up.out" \
    && grep -q '2 live replicas applied .* state digests agree' "\$out/cluster-up.out"
}
name=cluster-up-verbs; step "microrep cluster up --fabric verbs: 3,000 commands, leader killed halfway" cluster_up
fi
if [ $mu_only -eq 0 ]; then
name=multicast-verbs; step "multicast over verbs: one order, a member stopped, the next view" env MICROREP_REQUIRE_RDMA=1 RUST_BACKTRACE=1 $multicast_bin --nocapture
bench_multicast() { # every point must deliver every message at every member
  uptime
  timeout -k 5 120 $microrep_bin bench multicast --fabric verbs --members 3 --sizes 64,10240 --millis 2000 --json \
    | tee "\$out/bench-multicast-verbs.json"
  [ "\${PIPESTATUS[0]}" -eq 0 ] && [ "\$(grep -c '"lost":0,' "\$out/bench-multicast-verbs.json")" -eq 2 ]
  local rc=\$?; uptime; return \$rc
}
name=bench-multicast-verbs; step "microrep bench multicast --fabric verbs: 3 members, 64 B and 10 KiB" bench_multicast
fi
if [ -n "$bench_bin" ]; then
  name=bench-verbs; step "verbs_latency benchmark" env MICROREP_REQUIRE_RDMA=1 $bench_bin --samples 5000
fi
if [ -n "$mu_bench_bin" ]; then
  name=bench-mu-verbs; step "Mu replication latency over verbs" $mu_bench_bin --samples 2000
fi
exit \$status
INSIDE

echo "==> running inside the soft-RoCE VM (log: $out/console.log)"
start=$(date +%s)
set +e
VM_TIMEOUT_S=${VM_TIMEOUT_S:-$((bench ? 900 : 600))} scripts/rxe-vm/run.sh "$out/inside.sh" "$out"
status=$?
set -e
grep -E '^(==>|    exit)' "$out/console.log" || true
for log in "$out"/*.log; do
  case "$log" in */console.log) continue ;; esac
  echo "---- $(basename "$log") (tail)"; tail -n 25 "$log"
done
echo "verbs-test: VM run took $(( $(date +%s) - start )) s, exit status $status"
exit "$status"
