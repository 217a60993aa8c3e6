#!/usr/bin/env bash
# What one relayed event of a slow stream costs the proxy, side by side: each given Rolter
# binary (say, two builds of different commits) in turn pinned to CPU 1, three mock engines
# and the slow-stream client on CPU 0; N concurrent streams of T tokens ITL ms apart, and
# perf stat on the proxy for their whole length: CPU time, io_uring submissions (SQEs) and
# system calls, each divided by the events relayed (N x T; stream setup included).
# Needs the release binaries and perf:
#   loadtest/slow_events.sh [--conns N] [--tokens T] [--itl-ms ITL] [--rounds R] [BINARY...]
#   (default: 500 streams of 100 tokens 50 ms apart, 2 rounds, the release build's rolter)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
CONNS=500; TOKENS=100; ITL=50; ROUNDS=2; SYSTEMS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift ;;
    --tokens) TOKENS=$2; shift ;;
    --itl-ms) ITL=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    *) SYSTEMS+=("$(realpath "$1")") ;;
  esac
  shift
done
[ ${#SYSTEMS[@]} -gt 0 ] || SYSTEMS=("$B/rolter")
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
trap 'pkill -f "rolter-mock --listen 127.0.0.1:1900" || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
start_mocks --model m --tokens "$TOKENS" --max-running 0
rolter_config rolter.toml 19700 off
EVENTS=$((CONNS * TOKENS))
per() { awk -v a="$1" -v b="$2" -v m="${3:-1}" 'BEGIN { printf "%.2f", a * m / b }'; }
echo "$CONNS streams of $TOKENS tokens $ITL ms apart: $EVENTS events per run"
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SYSTEMS[@]}"; do
    ROLTER_LOG=warn taskset -c 1 "$s" run --config rolter.toml >rolter.log 2>&1 &
    G=$!
    for _ in $(seq 50); do
      (exec 3<>/dev/tcp/127.0.0.1/19700) 2>/dev/null && break
      sleep 0.1
    done
    perf stat -x, -e 'task-clock,io_uring:io_uring_submit_req,raw_syscalls:sys_enter' \
      -p "$G" -o perf.txt &
    P=$!
    sleep 0.2
    taskset -c 0 "$B/rolter-loadclient" slow --addr 127.0.0.1:19700 --conns "$CONNS" \
      --tokens "$TOKENS" --itl-ms "$ITL" --out slow.json >/dev/null
    kill -INT "$P"; wait "$P" || true
    kill "$G"; wait "$G" || true
    completed=$(grep -o '"completed": *[0-9]*' slow.json | grep -o '[0-9]*$')
    field() { awk -F, -v e="$1" '$3 ~ e { print $1 }' perf.txt; }
    ms=$(field task-clock); sqe=$(field io_uring_submit_req); sc=$(field sys_enter)
    echo "round $r $s completed=$completed/$CONNS cpu_us/event=$(per "$ms" "$EVENTS" 1000)" \
      "sqes/event=$(per "$sqe" "$EVENTS") syscalls/event=$(per "$sc" "$EVENTS")"
  done
done
