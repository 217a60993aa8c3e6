#!/usr/bin/env bash
# What the shared state store costs a request: one Rolter worker in front of three mock
# engines, round_robin with its per-core cursor, then with `atomic = true` (one store call
# per pick) and with `atomic = true, lease = 16`, against a local redis-server, interleaved
# over rounds. Reports wrk's req/s and latency and the mean wait for the store per ask.
#
#   loadtest/shared-state.sh [--rounds N] [--duration S] [--connections N] [--skip-build]
#
# Needs wrk, redis-server and curl (loadtest/run.sh installs wrk; tests/run.sh installs
# redis-server). Loopback only; the proxy runs on core 0, everything else on the others.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ROUNDS=3; DUR=5; CONNS=16; SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "shared-state.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for t in wrk redis-server curl taskset; do
  command -v $t >/dev/null || { echo "shared-state.sh: $t not found" >&2; exit 1; }
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[ $SKIP_BUILD = 1 ] || cargo build --release -q -p rolter -p rolter-mock
ROLTER=$TARGET/release/rolter; MOCK=$TARGET/release/rolter-mock
CPUS=$(nproc); OTHERS="1-$((CPUS - 1))"; [ "$CPUS" -gt 1 ] || OTHERS=0
OUT=$(mktemp -d /tmp/rolter-shared-state.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

taskset -c "$OTHERS" redis-server --port 19500 --save "" --appendonly no --daemonize no \
  >"$OUT/redis.log" 2>&1 & PIDS+=($!); wait_port 19500
TARGETS=""
for i in 1 2 3; do
  taskset -c "$OTHERS" "$MOCK" --listen "127.0.0.1:1950$i" --name "mock$i" --model m \
    --tokens 8 --max-running 0 --threads 1 >"$OUT/mock$i.log" 2>&1 & PIDS+=($!)
  wait_port "1950$i"
  TARGETS+=$'\n'"[[targets]]"$'\n'"name = \"mock$i\""$'\n'"url = \"http://127.0.0.1:1950$i\""$'\n'
done
cat >"$OUT/chat.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"Hello there"}]}'
wrk.headers["Content-Type"] = "application/json"
LUA

declare -A STRATEGY=(
  [local]='"round_robin"'
  [atomic]='{ name = "round_robin", atomic = true }'
  [lease16]='{ name = "round_robin", atomic = true, lease = 16 }'
)
MODES="local atomic lease16"
echo "mode round rps p50 p99 asks wait_us_per_ask fallbacks" >"$OUT/runs.txt"
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    cat >"$OUT/$mode.toml" <<TOML
[server]
listen = "127.0.0.1:19510"
workers = 1
pin_workers = false
[log]
access = "off"
[admin]
listen = "127.0.0.1:19511"
[state]
backend = "redis"
url = "redis://127.0.0.1:19500"
key_prefix = "bench-$round-$mode"
$TARGETS
[[routes]]
name = "r"
targets = ["mock1", "mock2", "mock3"]
strategy = ${STRATEGY[$mode]}
TOML
    taskset -c 0 "$ROLTER" run --config "$OUT/$mode.toml" >"$OUT/rolter-$mode.log" 2>&1 &
    RP=$!; wait_port 19510
    taskset -c "$OTHERS" wrk -t1 -c"$CONNS" -d1s -s "$OUT/chat.lua" http://127.0.0.1:19510/v1/chat/completions >/dev/null
    taskset -c "$OTHERS" wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s "$OUT/chat.lua" \
      http://127.0.0.1:19510/v1/chat/completions >"$OUT/wrk-$round-$mode.txt"
    M=$(curl -s http://127.0.0.1:19511/metrics)
    asks=$(echo "$M" | awk '/^rolter_state_rotations_total\{result="ok"\}/ {print $2}')
    wait=$(echo "$M" | awk '/^rolter_state_rotation_wait_seconds_total/ {printf "%.1f", $2 * 1e6}')
    fb=$(echo "$M" | awk '/^rolter_strategy_fallbacks_total/ {s+=$2} END {print s+0}')
    kill "$RP"; wait "$RP" 2>/dev/null || true
    rps=$(awk '/Requests\/sec/ {print $2}' "$OUT/wrk-$round-$mode.txt")
    p50=$(awk '$1=="50%" {print $2}' "$OUT/wrk-$round-$mode.txt")
    p99=$(awk '$1=="99%" {print $2}' "$OUT/wrk-$round-$mode.txt")
    per=$(awk -v a="${asks:-0}" -v w="${wait:-0}" 'BEGIN { if (a > 0) printf "%.1f", w / a; else print "-" }')
    echo "$mode $round $rps $p50 $p99 ${asks:-0} $per $fb" | tee -a "$OUT/runs.txt"
  done
done
echo
echo "| mode | req/s (median) | p50 | p99 | store wait per ask |"
echo "|---|---|---|---|---|"
for mode in $MODES; do
  awk -v m="$mode" '$1==m' "$OUT/runs.txt" | sort -k3 -n | awk -v n="$ROUNDS" -v m="$mode" \
    'NR==int((n+1)/2) {printf "| %s | %s | %s | %s | %s µs |\n", m, $3, $4, $5, $7}'
done
echo "(raw results: $OUT)"
