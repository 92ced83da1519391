#!/usr/bin/env bash
# Regenerates the C header crates/capi/include/microrep.h from crates/capi/src with cbindgen;
# `--check` instead fails if the checked-in header differs from what cbindgen would write
# (CI). Installs cbindgen from crates.io (pinned) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
version=0.29.4
if ! cbindgen --version 2>/dev/null | grep -qx "cbindgen $version"; then
  echo "capi-header: installing cbindgen $version"
  cargo install --locked --quiet cbindgen --version "$version"
fi
args=(--config crates/capi/cbindgen.toml --crate microrep-capi --output crates/capi/include/microrep.h --quiet)
case "${1:-}" in
  "") cbindgen "${args[@]}" crates/capi ;;
  --check)
    if ! cbindgen "${args[@]}" --verify crates/capi; then
      echo "capi-header: crates/capi/include/microrep.h is stale: run scripts/capi-header.sh and commit it" >&2
      exit 1
    fi ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
