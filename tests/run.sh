#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine when it is missing —
# system packages with apt-get (curl, python3 with pip, g++, Python's ZMQ and msgpack
# bindings, redis-server, dnsmasq, and Prometheus's promtool where the distribution ships it), the
# OpenAI and Anthropic Python SDKs, Hugging Face's tokenizers and jinja2, OpenTelemetry's
# protobuf definitions (opentelemetry-proto) with pip, the
# pinned Rust toolchain with rustup, and cargo-afl (with its AFL++ runtime, for fuzz/run.sh)
# with cargo install — saying what it installs, then runs formatting, lints,
# the module-import and function-length checks and the whole test suite: the default build,
# then the lean build (`--no-default-features`: no ZMQ, no local tokenizer, no demo), whose
# dependency tree is checked to hold none of them; last, each parser's fuzz target for 20 s.
#
#   ./tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

# System packages: curl for the demo check, python3 with pip for the OpenAI SDK test,
# g++ for the vendored libzmq (built by the zmq crate), Debian's pyzmq and msgpack for
# tests/kv_events_pyzmq.rs (which tries python3, then /usr/bin/python3, where Debian's
# python3-* modules live), promtool for tests/metrics_promtool.rs (Debian and Ubuntu
# ship it in the `prometheus` package; where no package has it, that test says it skips
# promtool's check), systemd for systemd-analyze (tests/systemd.rs verifies and scores
# config/rolter.service with it) and util-linux for setpriv (the same test reads the
# installed configuration as an unprivileged uid), redis-server for the shared-state tests
# of crates/store (with redis-tools' redis-cli, which builds their three-node cluster),
# dnsmasq-base's dnsmasq, the DNS server tests/discovery.rs serves its zone from.
missing=()
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] || missing+=(dnsmasq-base)
py_kv() { "$1" -c 'import zmq, msgpack' >/dev/null 2>&1; }
py_kv python3 || py_kv /usr/bin/python3 || missing+=(python3 python3-zmq python3-msgpack)
want_promtool=false
command -v promtool >/dev/null 2>&1 || want_promtool=true
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ] || $want_promtool; then
  $SUDO apt-get update -qq
  if $want_promtool; then
    if apt-cache show prometheus >/dev/null 2>&1; then
      missing+=(prometheus)
    else
      log "no package ships promtool here: tests/metrics_promtool.rs will skip its check"
    fi
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "system packages: all present"
fi

# The official OpenAI Python SDK, used by tests/openai_sdk.rs as a real client.
if ! python3 -c 'import openai' >/dev/null 2>&1; then
  log "installing the openai Python package"
  python3 -m pip install --quiet 'openai>=1.40' \
    || python3 -m pip install --quiet --break-system-packages 'openai>=1.40'
fi

# The official Anthropic Python SDK, used by tests/anthropic_sdk.rs as a real client.
if ! python3 -c 'import anthropic' >/dev/null 2>&1; then
  log "installing the anthropic Python package"
  python3 -m pip install --quiet 'anthropic>=0.40' \
    || python3 -m pip install --quiet --break-system-packages 'anthropic>=0.40'
fi

# Hugging Face's tokenizers and jinja2, the reference implementations that
# tests/tokenize_python.rs checks the local tokenizer's ids against.
if ! python3 -c 'import tokenizers, jinja2' >/dev/null 2>&1; then
  log "installing the tokenizers and jinja2 Python packages"
  python3 -m pip install --quiet 'tokenizers>=0.20' 'jinja2>=3.1' \
    || python3 -m pip install --quiet --break-system-packages 'tokenizers>=0.20' 'jinja2>=3.1'
fi

# OpenTelemetry's protobuf definitions (opentelemetry-proto, with protobuf), which the test
# OTLP receiver tests/py/otlp_receiver.py decodes the trace exporter's requests with.
if ! python3 -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2' >/dev/null 2>&1; then
  log "installing the opentelemetry-proto Python package"
  python3 -m pip install --quiet 'opentelemetry-proto>=1.20' \
    || python3 -m pip install --quiet --break-system-packages 'opentelemetry-proto>=1.20'
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
      log "installing the Rust toolchain $want (rustup, with rustfmt and clippy)"
      rustup toolchain install "$want" --component rustfmt clippy
    fi
  fi
fi

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
log "the import-circle check's own tests (tests/check_imports_test.py)"
python3 tests/check_imports_test.py
log "no import circle between modules (tests/check_imports.py)"
python3 tests/check_imports.py crates/*/src src loadtest/*/src
log "the function-length check's own tests (tests/check_fn_length_test.py)"
python3 tests/check_fn_length_test.py
log "no production function in crates/ over 100 lines (tests/check_fn_length.py)"
python3 tests/check_fn_length.py crates
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
# The demo alone needs only the mock engine's HTTP side: no ZMQ.
log "demo build: cargo tree -e normal --no-default-features --features demo"
if cargo tree -p rolter -e normal --no-default-features --features demo --prefix none \
    | grep -E '^(zmq|zmq-sys) '; then
  echo "the demo build depends on ZMQ (listed above)" >&2
  exit 1
fi
log "lean build: cargo clippy --no-default-features"
cargo clippy "${LEAN[@]}" --all-targets --no-default-features -- -D warnings
log "lean build: cargo test --no-default-features"
# The replica parity comparisons (tests/replica_parity.rs, minutes of seeded runs) exercise
# nothing the optional features change; they run once, in the default build above.
cargo test "${LEAN[@]}" --no-default-features -- --skip on_three_replicas_keeps_one_gateways_hit_rate
log "fuzzing: each parser's target for 20 s (fuzz/run.sh)"
./fuzz/run.sh 20
