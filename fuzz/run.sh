#!/usr/bin/env bash
# Fuzzes each parser target with AFL++ for SECONDS (default 20), on the pinned stable
# toolchain: installs cargo-afl when it is missing (pinned, with cargo install --locked),
# builds its AFL++ runtime when that is missing (cargo afl config --build), builds the
# targets (cargo afl build --release), replays the corpora and the saved regressions
# (cargo test), then runs each target with `cargo afl fuzz -V SECONDS`, each run bounded by
# `timeout`, as many at once as there are CPUs. A crash is printed in hex, copied to regressions/<target>/ (where the replay
# test keeps it) and fails the script once every target has run.
#
#   fuzz/run.sh [SECONDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

seconds=${1:-20}
case $seconds in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
# The version of the `afl` crate in Cargo.toml: cargo-afl and the crate go together.
cargo_afl_version=0.18.2
# This workspace's own target directory, whatever the caller's environment says.
export CARGO_TARGET_DIR="$here/target"

log() { printf '==> %s\n' "$*"; }

if ! cargo afl --version 2>/dev/null | grep -q " $cargo_afl_version"; then
  log "installing cargo-afl $cargo_afl_version (cargo install --locked)"
  cargo install --locked --force "cargo-afl@$cargo_afl_version"
fi
# Every subcommand but `config` refuses to run until the runtime is built for this rustc.
if ! cargo afl build --help >/dev/null 2>&1; then
  log "building the AFL++ runtime (cargo afl config --build)"
  cargo afl config --build
fi

log "cargo fmt --check (the fuzz workspace)"
cargo fmt --check
log "building the fuzz targets (cargo afl build --release)"
cargo afl build --release --locked
log "replaying the corpora and regressions (cargo test)"
cargo test --locked

# AFL++ unattended in a container without root's tuning: no UI, no CPU-frequency check, no
# core binding (other jobs share the cores); a core_pattern piped to a program would hide
# crashes from AFL++, which then refuses to start unless told it does not care.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
if [ "$(cut -c1 /proc/sys/kernel/core_pattern 2>/dev/null)" = "|" ]; then
  log "core_pattern pipes core dumps to a program: AFL++ runs with AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES"
fi

# One field of a fuzzer_stats file, or "?" (older AFL++ names some fields differently).
afl_stat() {
  local file=$1; shift
  local key value
  for key in "$@"; do
    value=$(sed -n "s/^$key *: *//p" "$file" 2>/dev/null | head -n1)
    if [ -n "$value" ]; then printf '%s' "$value"; return; fi
  done
  printf '?'
}

# One target's run, its output under out/: `-V` ends it after SECONDS, `timeout` anyway
# should AFL++ hang.
fuzz_one() {
  local target=$1 status=0
  rm -rf "out/$target"
  timeout --signal=INT --kill-after=15 $((seconds + 90)) \
    cargo afl fuzz -V "$seconds" -i "corpus/$target" -o "out/$target" -- "$CARGO_TARGET_DIR/release/$target" \
    >"out/$target.log" 2>&1 || status=$?
  echo "$status" >"out/$target.status"
}

# As many targets at once as there are CPUs (each AFL++ instance uses one).
mkdir -p out
jobs=$(nproc 2>/dev/null || echo 1)
targets=()
for src in src/bin/*.rs; do
  target=$(basename "$src" .rs)
  targets+=("$target")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  log "fuzzing $target for ${seconds}s"
  fuzz_one "$target" &
done
wait

failed=()
for target in "${targets[@]}"; do
  out="out/$target"
  status=$(cat "out/$target.status" 2>/dev/null || echo "?")
  stats="$out/default/fuzzer_stats"
  if [ "$status" != 0 ] || [ ! -f "$stats" ]; then
    echo "afl-fuzz on $target exited with status $status; the end of out/$target.log:" >&2
    tail -n 30 "out/$target.log" >&2
    failed+=("$target (afl-fuzz status $status)")
    continue
  fi
  crashes=()
  for f in "$out"/default/crashes/id:*; do
    [ -e "$f" ] && crashes+=("$f")
  done
  printf '%s: execs_done=%s execs_per_sec=%s corpus_count=%s saved_crashes=%s saved_hangs=%s stability=%s\n' \
    "$target" "$(afl_stat "$stats" execs_done)" "$(afl_stat "$stats" execs_per_sec)" \
    "$(afl_stat "$stats" corpus_count paths_total)" "$(afl_stat "$stats" saved_crashes unique_crashes)" \
    "$(afl_stat "$stats" saved_hangs unique_hangs)" "$(afl_stat "$stats" stability)"
  if [ ${#crashes[@]} -gt 0 ]; then
    mkdir -p "regressions/$target"
    for f in "${crashes[@]}"; do
      name="crash-$(sha1sum "$f" | cut -c1-16)"
      echo "crash in $target: $f -> regressions/$target/$name" >&2
      od -A x -t x1z "$f" | head -n 16 >&2 || true
      cp "$f" "regressions/$target/$name"
    done
    failed+=("$target (${#crashes[@]} crashes)")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing failed: ${failed[*]}" >&2
  echo "reproduce a crash with: (cd fuzz && cargo run --bin TARGET -- regressions/TARGET/FILE)" >&2
  exit 1
fi
log "fuzzing: no crash in ${seconds}s per target"
