#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine (system packages and
# the OpenAI Python SDK), then runs formatting, lints and the whole test suite: the default
# build, then the lean build (`--no-default-features`: no ZMQ, no local tokenizer, no demo),
# whose dependency tree is checked to hold none of them.
#
#   ./tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

# System packages: curl for the demo check, python3 with pip for the OpenAI SDK test,
# g++ for the vendored libzmq (built by the zmq crate), and Debian's pyzmq and msgpack for
# tests/kv_events_pyzmq.rs (which tries python3, then /usr/bin/python3, where Debian's
# python3-* modules live); systemd for systemd-analyze (tests/systemd.rs verifies and scores
# config/rolter.service with it) and util-linux for setpriv (the same test reads the
# installed configuration as an unprivileged uid).
missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
py_kv() { "$1" -c 'import zmq, msgpack' >/dev/null 2>&1; }
py_kv python3 || py_kv /usr/bin/python3 || missing+=(python3 python3-zmq python3-msgpack)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The official OpenAI Python SDK, used by tests/openai_sdk.rs as a real client.
if ! python3 -c 'import openai' >/dev/null 2>&1; then
  log "installing the openai Python package"
  python3 -m pip install --quiet 'openai>=1.40' \
    || python3 -m pip install --quiet --break-system-packages 'openai>=1.40'
fi

# The toolchain pinned in rust-toolchain.toml, with rustfmt and clippy. When the installed
# stable toolchain is that very version, it serves under the pinned name (no download).
if command -v rustup >/dev/null 2>&1; then
  want=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  if ! rustup toolchain list | grep -q "^$want-"; then
    have=$(rustc +stable --version 2>/dev/null | awk '{print $2}')
    if [ "$have" = "$want" ]; then
      host=$(rustc +stable -vV | sed -n 's/^host: //p')
      log "using the installed stable toolchain as $want"
      ln -s "$(rustc +stable --print sysroot)" "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$want-$host"
    else
      rustup toolchain install "$want" --component rustfmt clippy
    fi
  fi
fi

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
log "no import circle between modules (tests/check_imports.py)"
python3 tests/check_imports.py crates/*/src src loadtest/*/src
log "cargo test"
cargo test --workspace

# The lean gateway: built, linted and tested without its optional features, and checked to
# link none of what they pull in.
LEAN=(-p rolter -p rolter-gateway -p rolter-config -p rolter-engine -p rolter-tokenize
      -p rolter-strategy -p rolter-codec -p rolter-core)
log "lean build: cargo tree -e normal --no-default-features"
if cargo tree -p rolter -e normal --no-default-features --prefix none \
    | grep -E '^(zmq|zmq-sys|tokenizers|onig|onig_sys|minijinja|rolter-mock) '; then
  echo "the lean build depends on an optional feature's crates (listed above)" >&2
  exit 1
fi
log "lean build: cargo clippy --no-default-features"
cargo clippy "${LEAN[@]}" --all-targets --no-default-features -- -D warnings
log "lean build: cargo test --no-default-features"
cargo test "${LEAN[@]}" --no-default-features
