#!/usr/bin/env bash
# Builds the `microrep` Python wheel (PyO3, stable ABI: one wheel for CPython >= 3.9) with
# maturin, into DIR (default: the cargo target dir's wheels/), and prints its path.
#
#   scripts/python-wheel.sh [--debug] [--out DIR]
#   pip install "$(scripts/python-wheel.sh)"
#
# maturin comes from PyPI into a build venv of its own (in the target dir), pinned below.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
target=${CARGO_TARGET_DIR:-$PWD/target}
out=$target/wheels
profile=(--release)
while (($#)); do
  case "$1" in
    --debug) profile=(); shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--debug] [--out DIR]" >&2; exit 2 ;;
  esac
done
venv=$target/python-build-venv
if [ ! -x "$venv/bin/maturin" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "maturin==1.16.0" >&2
fi
rm -f "$out"/microrep-*.whl
"$venv/bin/maturin" build --quiet "${profile[@]}" --locked -m crates/python/Cargo.toml --out "$out" >&2
ls "$out"/microrep-*.whl
