#!/usr/bin/env bash
# Builds the C library (release) and installs it: PREFIX/lib/libmicrorep.{so,a},
# PREFIX/include/microrep.h and PREFIX/lib/pkgconfig/microrep.pc (docs/CAPI.md).
#
#   scripts/capi-install.sh [--prefix DIR] [--lib-dir DIR]
#     --prefix DIR    where to install (default /usr/local)
#     --lib-dir DIR   install the libraries already built in DIR instead of building them
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
lib_dir=
while (($#)); do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --lib-dir) lib_dir=$2; shift 2 ;;
    *) echo "usage: $0 [--prefix DIR] [--lib-dir DIR]" >&2; exit 2 ;;
  esac
done
if [ -z "$lib_dir" ]; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
  cargo build --release --locked -p microrep-capi
  lib_dir=${CARGO_TARGET_DIR:-target}/release
fi
for f in libmicrorep.so libmicrorep.a; do
  [ -f "$lib_dir/$f" ] || { echo "capi-install: $lib_dir/$f is missing" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$lib_dir/libmicrorep.so" "$prefix/lib/"
install -m 0644 "$lib_dir/libmicrorep.a" "$prefix/lib/"
install -m 0644 crates/capi/include/microrep.h "$prefix/include/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/capi/microrep.pc.in >"$prefix/lib/pkgconfig/microrep.pc"
echo "capi-install: installed libmicrorep $version into $prefix"
