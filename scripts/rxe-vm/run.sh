#!/usr/bin/env bash
# Boots the soft-RoCE VM built by build.sh and runs `bash SCRIPT` as root inside it; exits with
# SCRIPT's exit status (or non-zero if the VM never reported one, e.g. on timeout or a crash).
#
# Usage: scripts/rxe-vm/run.sh SCRIPT OUTDIR
#   SCRIPT  absolute path of a bash script on this machine (not under /tmp: the VM's /tmp, /run and
#           /dev/shm are fresh tmpfs, so nothing there is visible inside)
#   OUTDIR  absolute path of an existing directory, shared read-write at the same path inside; the
#           VM's console goes to OUTDIR/console.log and its exit status to OUTDIR/vm-exit
#
# Inside: this machine's / read-only, soft-RoCE device rxe0 on veth0 (10.99.0.1/24; GID index 1
# is its RoCE v2 GID), `ulimit -l unlimited`; programs reach each other over rxe0 by loopback.
# The VM runs under software emulation (TCG: KVM does not work on our machines), 2 vCPUs.
# Env: VM_DIR (default target/rxe-vm), VM_MEM_MB (2048), VM_TIMEOUT_S (600), VM_CLOCK (unset: the
# guest kernel's choice, which under TCG is the HPET, each clock read a trap of about 4 us; `tsc`:
# the TSC, read in user space as on a real server; docs/BENCHMARKS.md, "A Mu commit over soft-RoCE,
# step by step").
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SCRIPT OUTDIR" >&2; exit 2; }
SCRIPT=$1; OUTDIR=$2
case "$SCRIPT$OUTDIR" in *" "*) echo "rxe-vm: paths must not contain spaces" >&2; exit 2 ;; esac
[ -f "$SCRIPT" ] && [ -d "$OUTDIR" ] || { echo "rxe-vm: $SCRIPT or $OUTDIR missing" >&2; exit 2; }
cd "$(dirname "$0")/../.."
REPO=$PWD
case "$REPO" in *" "*) echo "rxe-vm: the repository path must not contain spaces" >&2; exit 2 ;; esac
VM_DIR=${VM_DIR:-$PWD/target/rxe-vm}
case "${VM_CLOCK:-}" in
  "") clock="" ;;
  tsc) clock="tsc=reliable clocksource=tsc " ;;
  *) echo "rxe-vm: VM_CLOCK must be unset or tsc, not '$VM_CLOCK'" >&2; exit 2 ;;
esac
rm -f "$OUTDIR/vm-exit"
set +e
timeout --kill-after=10 "${VM_TIMEOUT_S:-600}" qemu-system-x86_64 -accel tcg -smp 2 -m "${VM_MEM_MB:-2048}" \
  -nographic -no-reboot -kernel "$VM_DIR/vmlinuz" -initrd "$VM_DIR/initrd.gz" \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$REPO,mount_tag=repo,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$OUTDIR,mount_tag=out,security_model=none" \
  -append "console=ttyS0 quiet panic=-1 ${clock}script=$SCRIPT outdir=$OUTDIR repo=$REPO" \
  </dev/null >"$OUTDIR/console.log" 2>&1
qemu_status=$?
set -e
if [ ! -s "$OUTDIR/vm-exit" ]; then
  echo "rxe-vm: the VM reported no exit status (qemu exit $qemu_status; 124 = timed out after ${VM_TIMEOUT_S:-600} s)" >&2
  tail -n 40 "$OUTDIR/console.log" >&2
  exit 1
fi
exit "$(cat "$OUTDIR/vm-exit")"
