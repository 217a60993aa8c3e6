#!/usr/bin/env bash
# CPU per request through a disaggregated (P/D) route against a plain route, side by side:
# one Rolter binary pinned to CPU 1, the mock engines and wrk on CPU 0, interleaved rounds
# of 8 s (after 2 s of warm-up) of the ~1 KiB chat body, plain (16 tokens) or streamed
# (64 tokens), 32 connections; utime and stime from /proc/PID/stat.
#   plain: round robin over three ordinary mock engines (one upstream exchange a request);
#   pd:    vLLM's protocol, round robin over two prefill and two decode mock engines
#          (two upstream exchanges a request: the prefill's answer read whole, then the
#          decode's relayed); the decode engines pull from the prefill engines, which costs
#          the engines, not the gateway;
#   pd-cache: the same fleet with the pools' usual strategies (cache_aware, least_loaded).
# A P/D request makes two upstream exchanges, so twice the plain route's CPU is the bound
# to beat. A saturating load runs each setup at its own top rate (the P/D setups' is the
# mock engines' limit: each decode pulls from its prefill); `--rate R` runs every setup at
# R requests/s instead (oha, open loop), so their costs per request compare at one load.
#   loadtest/pd_cpu.sh [--rounds N] [--load chat|stream] [--rate R] [BINARY]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=3; LOAD=chat; BIN=$B/rolter; RATE=
OHA=${OHA:-$ROOT/loadtest/.tools/bin/oha}
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --load) LOAD=$2; shift ;;
    --rate) RATE=$2; shift ;;
    *) BIN=$(realpath "$1") ;;
  esac
  shift
done
TMP=$(mktemp -d); cd "$TMP"
trap 'pkill -f "rolter-mock --listen 127.0.0.1:190" || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
start_mocks --model m --tokens 64 --max-running 0
for p in 19011 19012; do
  taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:$p --threads 1 --model m --tokens 64 \
    --max-running 0 --pd-role prefill >/dev/null 2>&1 &
done
for p in 19021 19022; do
  taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:$p --threads 1 --model m --tokens 64 \
    --max-running 0 --pd-role decode >/dev/null 2>&1 &
done
sleep 0.3
rolter_config plain.toml 19700 off
pd_config() {
  cat >"$1" <<T
[server]
listen = "127.0.0.1:19700"
workers = 1
pin_workers = false
[log]
access = "off"
[[targets]]
name = "p1"
url = "http://127.0.0.1:19011"
[[targets]]
name = "p2"
url = "http://127.0.0.1:19012"
[[targets]]
name = "d1"
url = "http://127.0.0.1:19021"
[[targets]]
name = "d2"
url = "http://127.0.0.1:19022"
[[routes]]
name = "chat"
disaggregation = "vllm"
prefill = { targets = ["p1", "p2"], strategy = "$2" }
decode = { targets = ["d1", "d2"], strategy = "$3" }
T
}
pd_config pd.toml round_robin round_robin
pd_config pd-cache.toml cache_aware least_loaded
STREAM=false; [ "$LOAD" = stream ] && STREAM=true
chat_wrk_script body.lua "$STREAM"
# The same body for oha.
sed -n 's/^wrk.body = \[\[\(.*\)\]\]$/\1/p' body.lua >body.json
# load SECONDS: the load for SECONDS; prints the requests served and their rate.
load() {
  if [ -n "$RATE" ]; then
    taskset -c 0 timeout 40 "$OHA" --no-tui --output-format json -z "${1}s" -c 32 -q "$RATE" \
      -m POST -H 'content-type: application/json' -D body.json "$URL" |
      python3 -c "import json,sys; d=json.load(sys.stdin); n=sum(d['statusCodeDistribution'].values()); bad=n-d['statusCodeDistribution'].get('200',0); print(n, round(d['summary']['requestsPerSec']), bad)"
  else
    taskset -c 0 timeout 40 wrk -t1 -c32 -d"${1}s" -s body.lua "$URL" |
      awk '/requests in/{n=$1} /Requests\/sec/{r=$2} /Non-2xx/{b=$NF} END{print n, r, b+0}'
  fi
}
TICK=$(getconf CLK_TCK)
URL=http://127.0.0.1:19700/v1/chat/completions
for r in $(seq 1 "$ROUNDS"); do
  for setup in plain pd pd-cache; do
    ROLTER_LOG=warn taskset -c 1 "$BIN" run --config "$setup.toml" >rolter.log 2>&1 &
    pid=$!
    wait_listening 19700
    load 2 >/dev/null
    read -r u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat)
    read -r n rps non2xx < <(load 8)
    read -r u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat)
    python3 -c "import sys; u,s,n,t=map(float,sys.argv[1:5]); print(f'round $r $setup req/s=$rps non2xx=$non2xx user={(u*1e6/t/n):.1f} sys={(s*1e6/t/n):.1f} total={((u+s)*1e6/t/n):.1f} us/req')" \
      $((u1 - u0)) $((s1 - s0)) "$n" "$TICK"
    kill $pid; wait $pid 2>/dev/null || true
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/19700) 2>/dev/null || break; sleep 0.1; done
  done
done
