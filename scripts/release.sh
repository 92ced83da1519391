#!/usr/bin/env bash
# Builds microrep's release artifacts and packs them into one directory and tarball:
#
#   dist/microrep-VERSION-ARCH/bin/microrep                    the command (cluster, node, wrap, bench, ...)
#   dist/microrep-VERSION-ARCH/lib/libmicrorep_interpose.so    the shim `microrep wrap` preloads
#   dist/microrep-VERSION-ARCH/lib/libmicrorep.{so,a}          the C library
#   dist/microrep-VERSION-ARCH/lib/pkgconfig/microrep.pc       (prefix: the directory itself)
#   dist/microrep-VERSION-ARCH/include/microrep.h
#   dist/microrep-VERSION-ARCH/share/doc/microrep/             README, LICENSE-*, docs/
#   dist/microrep-VERSION-ARCH.tar.gz
#
#   scripts/release.sh [--verbs] [--out DIR]
#     --verbs     build the RDMA verbs fabric in (needs libclang-dev to build; the binary loads
#                 libibverbs at run time, so it also runs where no RDMA stack is installed)
#     --out DIR   where to put the result (default dist/)
#
# `microrep wrap` finds the shim beside the binary or in ../lib/ (as laid out here); see
# docs/INSTALL.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist
features=()
while (($#)); do
  case "$1" in
    --verbs) features=(--features verbs); shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--verbs] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
command -v cargo >/dev/null || { echo "release: cargo not found (see README: Rust stable >= 1.89 from rustup)" >&2; exit 1; }

cargo build --release --locked -p microrep-cli "${features[@]}"
cargo build --release --locked -p microrep-interpose -p microrep-capi
target=${CARGO_TARGET_DIR:-target}/release
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
name="microrep-$version-$(uname -m)"
dir="$out/$name"
rm -rf "$dir"
install -d "$dir/bin" "$dir/lib/pkgconfig" "$dir/include" "$dir/share/doc/microrep"
install -m 0755 "$target/microrep" "$dir/bin/"
install -m 0755 "$target/libmicrorep_interpose.so" "$dir/lib/"
scripts/capi-install.sh --prefix "$(cd "$dir" && pwd)" --lib-dir "$target" >/dev/null
# The pkg-config file names an absolute prefix; a relocatable one uses pcfiledir.
sed -i "s|^prefix=.*|prefix=\${pcfiledir}/../..|" "$dir/lib/pkgconfig/microrep.pc"
cp -r README.md LICENSE-MIT LICENSE-APACHE docs "$dir/share/doc/microrep/"
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
echo "release: $dir and $out/$name.tar.gz"
"$dir/bin/microrep" --version
