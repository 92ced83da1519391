#!/usr/bin/env bash
# Builds the `microrep` wheel (debug profile unless --release), installs it into a fresh venv
# with pytest, and runs the Python tests (crates/python/tests): what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=--debug
[ "${1:-}" = --release ] && profile=
target=${CARGO_TARGET_DIR:-$PWD/target}
wheel=$(scripts/python-wheel.sh $profile)
venv=$target/python-test-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "$wheel" "pytest==9.2.0"
# From outside the source tree: the tests import the installed wheel, not crates/python/python.
cd crates/python/tests
PYTHONDONTWRITEBYTECODE=1 timeout 600 "$venv/bin/python" -m pytest -p no:cacheprovider -q .
