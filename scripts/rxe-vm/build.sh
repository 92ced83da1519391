#!/usr/bin/env bash
# Builds the boot files of the soft-RoCE test VM: $VM_DIR/vmlinuz and $VM_DIR/initrd.gz.
#
# The host kernel of our machines has no InfiniBand support, so the VM boots Debian's own kernel
# (from the linux-image package, which ships rdma_rxe as a module) with a busybox initramfs. The
# initramfs loads the modules, mounts the host's / read-only over 9p, creates a veth pair with a
# soft-RoCE device rxe0 on it, and runs the script named on the kernel command line as root in a
# chroot of the host's /. See scripts/rxe-vm/run.sh and docs/VERBS.md.
#
# Usage: scripts/rxe-vm/build.sh        (VM_DIR defaults to target/rxe-vm)
# Needs root for apt-get; installs only missing packages. Skips the build when the boot files for
# the newest Debian kernel are already there (delete $VM_DIR to force it).
set -euo pipefail
cd "$(dirname "$0")/../.."
VM_DIR=${VM_DIR:-$PWD/target/rxe-vm}
mkdir -p "$VM_DIR"
VM_DIR=$(cd "$VM_DIR" && pwd)

packages=(qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-utils perftest)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "rxe-vm: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The newest Debian kernel image (the one linux-image-amd64 depends on).
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$pkg" ] || { echo "rxe-vm: no Debian linux-image package found (apt-cache depends linux-image-amd64)" >&2; exit 1; }
# The boot files depend on the kernel package and on this script (the /init it writes).
stamp="$pkg $(sha256sum "$0" | cut -c1-16)"
if [ -f "$VM_DIR/vmlinuz" ] && [ -f "$VM_DIR/initrd.gz" ] && [ "$(cat "$VM_DIR/kernel-package" 2>/dev/null)" = "$stamp" ]; then
  echo "rxe-vm: boot files for $pkg are up to date in $VM_DIR"
  exit 0
fi

work=$(mktemp -d "$VM_DIR/work.XXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || { echo "rxe-vm: apt-get download $pkg failed" >&2; exit 1; }
dpkg-deb -x "$work"/linux-image-*.deb "$work/k"
kver=$(ls "$work/k/lib/modules")
depmod -b "$work/k" "$kver"
mods_dir="$work/k/lib/modules/$kver"
root="$work/initrd"
mkdir -p "$root"/{bin,proc,sys,dev,host} "$root/lib/modules/$kver"
cp /bin/busybox "$root/bin/"

# Each module with its dependencies, as modules.dep lists them.
modules="crc32_generic virtio_pci 9pnet_virtio 9p rdma_rxe ib_uverbs veth"
for m in $modules; do
  for f in $(grep -E "/$m.ko(\.[a-z]+)?:" "$mods_dir/modules.dep" | tr -d ':'); do
    mkdir -p "$root/lib/modules/$kver/$(dirname "$f")"
    cp "$mods_dir/$f" "$root/lib/modules/$kver/$f"
  done
done
cp "$mods_dir/modules.dep" "$root/lib/modules/$kver/"

# /init: the script's exit status goes to the console ("RXE-VM-EXIT=n") and to $OUTDIR/vm-exit,
# so run.sh can propagate it.
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
for m in $modules; do modprobe \$m || echo "rxe-vm: modprobe \$m failed"; done
INIT
cat >> "$root/init" <<'INIT'
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host || echo "rxe-vm: 9p mount of / failed"
mount -t proc proc /host/proc; mount -t sysfs sysfs /host/sys; mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp; mount -t tmpfs run /host/run
mkdir -p /host/dev/pts /host/dev/shm; mount -t devpts devpts /host/dev/pts; mount -t tmpfs shm /host/dev/shm
arg() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" /proc/cmdline; }
OUTDIR=$(arg outdir); SCRIPT=$(arg script); REPO=$(arg repo)
# The repository (test binaries, scripts) and the out dir are shares of their own, mounted
# over the fresh tmpfs mounts above: a checkout under /tmp is visible inside too.
mkdir -p "/host$REPO" "/host$OUTDIR" 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 repo "/host$REPO" || echo "rxe-vm: 9p mount of $REPO failed"
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 out "/host$OUTDIR" || echo "rxe-vm: 9p mount of $OUTDIR failed"
chroot /host /bin/bash -c "export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ulimit -l unlimited
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.99.0.1/24 dev veth0; ip link set veth0 up; ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0
bash $SCRIPT"
status=$?
echo "$status" > "/host$OUTDIR/vm-exit"
echo "RXE-VM-EXIT=$status"
sync
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$VM_DIR/initrd.gz")
cp "$work/k/boot/vmlinuz-$kver" "$VM_DIR/vmlinuz"
echo "$stamp" > "$VM_DIR/kernel-package"
echo "rxe-vm: built $VM_DIR/vmlinuz and $VM_DIR/initrd.gz (kernel $kver)"
