#!/usr/bin/env bash
# What part of the added time to first byte is the two-CPU layout's wake-ups: the load
# client on CPU 0 makes sequential streaming requests (scenario 3's: head at once, first
# token after 2 ms) to
#   direct_same   a mock engine on CPU 0, the client's own CPU (the harness's "direct");
#   direct_cross  a mock engine on CPU 1 (two cross-CPU wake-ups per request, no proxy);
#   rolter        Rolter on CPU 1 in front of the CPU-0 engine (default mode);
#   rolter_busy   the same with busy polling (server.busy_poll = "1ms");
# in interleaved rounds, and prints each round's TTFB p50 and p99.
# Needs the release binaries:
#   loadtest/ttfb_floor.sh [--rounds N] [--requests N]   (default: 3 rounds of 200)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=3; REQS=200
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --requests) REQS=$2; shift ;;
    *) echo "ttfb_floor.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(nproc)" -ge 2 ] || { echo "ttfb_floor.sh: needs two CPUs" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:19001 --threads 1 --model m >/dev/null 2>&1 &
PIDS+=($!)
taskset -c 1 "$B/rolter-mock" --listen 127.0.0.1:19011 --threads 1 --model m >/dev/null 2>&1 &
PIDS+=($!)
for mode in default busy; do
  port=19700; poll=""
  [ $mode = busy ] && { port=19701; poll='busy_poll = "1ms"'; }
  cat >"$mode.toml" <<T
[server]
listen = "127.0.0.1:$port"
workers = 1
pin_workers = false
$poll
[log]
access = "off"
[[targets]]
name = "mock1"
url = "http://127.0.0.1:19001"
[[routes]]
name = "all"
targets = ["mock1"]
strategy = "round_robin"
T
done
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; }
wait_port 19001; wait_port 19011
for r in $(seq 1 "$ROUNDS"); do
  for sys in direct_same direct_cross rolter rolter_busy; do
    pid=""
    case $sys in
      direct_same) port=19001 ;;
      direct_cross) port=19011 ;;
      rolter) port=19700; conf=default.toml ;;
      rolter_busy) port=19701; conf=busy.toml ;;
    esac
    if [ $port -ge 19700 ]; then
      ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config "$conf" >rolter.log 2>&1 &
      pid=$!; PIDS+=($pid); wait_port $port
    fi
    taskset -c 0 "$B/rolter-loadclient" stream --addr 127.0.0.1:$port --requests "$REQS" \
      --warmup 5 --tokens 4 --itl-ms 3 --ttft-ms 2 --out "$sys.json" >/dev/null
    [ -n "$pid" ] && { kill "$pid"; wait "$pid" 2>/dev/null || true; }
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); t=d['ttfb_us']
print(f\"round $r $sys ttfb p50={t['p50']:.0f} us p99={t['p99']:.0f} us errors={d['errors']}\")" "$sys.json"
  done
done
