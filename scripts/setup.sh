#!/usr/bin/env bash
# Installs what building and testing microrep needs on Debian 12: system packages through apt,
# and checks for a Rust toolchain (stable >= 1.89; rustup's, since Debian 12 ships 1.63).
# Safe to run repeatedly: it installs only what is missing.
set -euo pipefail

# libclang-dev, cmake: building the verbs backend (bindgen). redis-tools: redis-cli and
# redis-benchmark, the clients of the key-value example; redis-server: the positive control of
# the fault harness (docs/RELIABILITY.md) and the server `microrep wrap` runs Redis's own test suite
# against (tcl: that suite's interpreter, scripts/redis-suite.sh). etcd-server, etcd-client: the etcd comparison of
# `microrep bench etcd` (scripts/bench-etcd.sh; it runs its own members on ports 17600+, not the
# packaged service's 2379). memcached, libmemcached-tools, python3-pymemcache, python3-pytest: the
# memcached `microrep wrap` tests (crates/cli/tests/wrap_memcached.rs) and scripts/memcached-suite.sh.
packages=(build-essential pkg-config procps ca-certificates iproute2 redis-tools redis-server libclang-dev cmake
  etcd-server etcd-client nftables tcl memcached libmemcached-tools python3-pymemcache python3-pytest
  python3-venv python3-dev)
# python3-venv, python3-dev: the venvs that build and test the Python wheel
# (scripts/python-test.sh) and libpython, which the bindings crate links in workspace builds;
# build-essential's cc and c++ compile the C ABI's examples.
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Go builds the linearizability checker of the fault tests (tools/linearizability).
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  echo "setup: installing golang-go"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends golang-go
fi

[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
if ! command -v cargo >/dev/null; then
  cat >&2 <<'MSG'
setup: no Rust toolchain found. microrep needs Rust stable >= 1.89 (Debian 12's rustc is 1.63).
Install rustup (https://rustup.rs, or Debian's `rustup` package on newer releases), then:
  rustup toolchain install stable --component rustfmt,clippy
MSG
  exit 1
fi
version=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n1.89.0\n' "$version" | sort -V | head -n1)" != "1.89.0" ]; then
  echo "setup: rustc $version is older than 1.89; run: rustup update stable" >&2
  exit 1
fi
