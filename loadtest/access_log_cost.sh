#!/usr/bin/env bash
# The access log's cost: two Rolter gateways, one writing its access log to a file and one
# with `[log] access = "off"`, pinned to CPU 1 with three mock engines and wrk on CPU 0;
# 3 interleaved rounds of 5 s of the scenario-1 load each; CPU per request from
# /proc/PID/stat (every thread of the process: workers, control, access-log writer).
# Needs the release binaries and a loadtest/run.sh result directory for the wrk script:
#   loadtest/access_log_cost.sh [results-dir]   (default: loadtest/results/latest run)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
RES=$(cd "${1:-$(ls -d "$ROOT"/loadtest/results/2*/ | tail -1)}" && pwd)
L=$RES/wrk-chat.lua
[ -f "$L" ] || { echo "no $L: run loadtest/run.sh --quick first" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
. "$ROOT/loadtest/mock_fleet.sh"
start_mocks
rolter_config g19601.toml 19601 "$TMP/access.log"; rolter_config g19602.toml 19602 off
ROLTER_LOG=warn taskset -c 1 $B/rolter run --config g19601.toml > on.out 2>&1 & ON=$!
ROLTER_LOG=warn taskset -c 1 $B/rolter run --config g19602.toml > off.out 2>&1 & OFF=$!
sleep 1
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for port in 19601 19602; do taskset -c 0 wrk -t1 -c32 -d1s -s $L http://127.0.0.1:$port/v1/chat/completions >/dev/null; done
for r in 1 2 3; do
  for port in 19601 19602; do
    pid=$([ $port = 19601 ] && echo $ON || echo $OFF)
    c0=$(cpu $pid)
    out=$(taskset -c 0 wrk -t1 -c32 -d5s -s $L http://127.0.0.1:$port/v1/chat/completions)
    c1=$(cpu $pid)
    n=$(echo "$out" | awk '/requests in/{print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
    echo "round $r port $port access=$([ $port = 19601 ] && echo file || echo off) requests=$n rps=$rps cpu_us_per_req=$(python3 -c "print(round(($c1-$c0)*10000/$n,2))")"
  done
done
wc -l $TMP/access.log
kill $ON $OFF; pkill -f "rolter-mock --listen 127.0.0.1:1900" || true
rm -rf "$TMP"
