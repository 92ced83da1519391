#!/usr/bin/env bash
# Every gate, in the order a reviewer would: format, lints, tests (unit, conformance on every
# backend, multi-process shm, tcp across network namespaces, Mu scenarios, runtime, KV server,
# CLI, the C ABI's examples), the C header's freshness, the Python wheel's tests, planted-bug
# detection, a 1,000-seed simulation slice, the verbs backend inside a soft-RoCE VM (about
# 5-10 minutes; MICROREP_SKIP_VM=1 skips it), docs. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

# Go (the porcupine checker of the fault tests) from its official install location if present.
export PATH="$PATH:/usr/local/go/bin"
step() { echo; echo "==> $*"; }
step "format";  cargo fmt --all -- --check
step "lints";   cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
step "build";   cargo build --workspace --all-targets --locked
step "tests";   cargo test --workspace --locked
step "C ABI: crates/capi/include/microrep.h is what cbindgen generates (its C and C++ examples ran in the tests)"
scripts/capi-header.sh --check
step "Python: build the wheel, pip install it into a fresh venv, pytest"
scripts/python-test.sh
step "shuttle: the local-log gate's handshake under explored thread schedules (and a broken gate caught)"
cargo test --locked -p microrep-core --features shuttle --test gate_shuttle
step "etcd load generator (tools/etcdbench): vet and unit tests"
(cd tools/etcdbench && go vet ./... && go test ./...)
step "tcp fabric across network namespaces (needs root; prints SKIPPED otherwise)"
cargo test --locked -p microrep-fabric --test tcp_netns -- --nocapture
step "planted bugs: the simulator's checkers catch each deliberate protocol bug"
cargo test --release --locked -p microrep-sim --features planted-bugs --test planted_bugs
step "planted bugs in the core's scenario tests (durable log, membership changes)"
cargo test --release --locked -p microrep-core --features planted-bugs --test mu_durable --test mu_membership
step "simulation: 1,000 seeds of 3, 5 and 7 replicas under faults"
cargo run --release --locked -p microrep-sim --quiet -- --seeds 1000
step "simulation: 1,000 seeds where crashed replicas restart with empty memory (at most a minority amnesic)"
cargo run --release --locked -p microrep-sim --quiet -- --start 100000 --seeds 1000 --restarts --bounded-amnesia
step "simulation: 200 seeds of 30 ms with up to 40 faults, replicas losing their memory one after another (each promoted back first)"
cargo run --release --locked -p microrep-sim --quiet -- --start 200000 --seeds 200 --restarts --bounded-amnesia \
  --amnesia-heals --fault-phase-us 30000 --max-faults 40
step "simulation: 1,000 swarm-testing seeds (per-seed fault mixes, link faults, the two planes as separate actors)"
cargo run --release --locked -p microrep-sim --quiet -- --start 300000 --seeds 1000 --swarm
step "simulation: 300 swarm-testing seeds with replicas losing their memory one after another"
cargo run --release --locked -p microrep-sim --quiet -- --start 400000 --seeds 300 --swarm --restarts --bounded-amnesia \
  --amnesia-heals
step "simulation: 1,000 seeds with half the fabric's operations instant, as on shm (leaders commit in the poll that proposed), and 300 swarm seeds with restarts"
cargo run --release --locked -p microrep-sim --quiet -- --start 900000 --seeds 1000 --instant 0.5 --replicas 3,4,5
cargo run --release --locked -p microrep-sim --quiet -- --start 950000 --seeds 300 --instant 0.5 --swarm --restarts \
  --bounded-amnesia --amnesia-heals
step "simulation: availability under minority faults, cluster sizes 1 to 9 (clients never go 5 simulated ms without an acknowledgement)"
cargo run --release --locked -p microrep-sim --quiet -- --start 600000 --seeds 1000 --replicas 1,2,3,4,5,6,7,8,9 \
  --max-gap-us 5000
step "simulation: 1,000 seeds of membership changes (joiners added, members removed) under faults, and 300 with swarm testing and restarts"
cargo run --release --locked -p microrep-sim --quiet -- --start 700000 --seeds 1000 --membership --replicas 5,6,7
cargo run --release --locked -p microrep-sim --quiet -- --start 800000 --seeds 300 --membership --replicas 5,6,7 \
  --swarm --restarts --bounded-amnesia --amnesia-heals
step "simulation: 1,000 seeds of a cluster that goes idle and rests between heartbeats (idle stride 16), and 300 swarm seeds with restarts"
cargo run --release --locked -p microrep-sim --quiet -- --start 1000000 --seeds 1000 --idle-stride 16
cargo run --release --locked -p microrep-sim --quiet -- --start 1100000 --seeds 300 --idle-stride 16 --swarm --restarts \
  --bounded-amnesia --amnesia-heals
step "multicast planted bugs: the multicast simulator's checkers catch each deliberate bug"
cargo test --release --locked -p microrep-multicast-sim --features planted-bugs --test planted_bugs
step "multicast simulation: 5,000 seeds (torn writes, pauses, a slow member, crashes and joins overlapping view changes, partitions, unordered subgroups)"
cargo run --release --locked -p microrep-multicast-sim --quiet -- --start 500000 --seeds 5000 --threads 2
step "fault testing of real clusters (and of a wrapped redis-server): SIGKILL/SIGSTOP nemesis, porcupine linearizability, negative control"
scripts/faults.sh --ci
step "Redis's own test suite, a slice of 6 units, plain and through microrep wrap (3 copies, digests compared)"
scripts/redis-suite.sh --slice
step "memcached through microrep wrap: pymemcache's tests, memccapable, memcached-tool, loads, plain and wrapped"
scripts/memcached-suite.sh
if [ "${MICROREP_SKIP_VM:-0}" = 1 ]; then
  step "verbs backend in a soft-RoCE VM: skipped (MICROREP_SKIP_VM=1)"
else
  step "verbs backend in a soft-RoCE VM: conformance, a 3-replica Mu cluster and microrep cluster up --fabric verbs, each with a leader kill"
  scripts/verbs-test.sh
fi
step "docs";    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
step "all gates passed"
