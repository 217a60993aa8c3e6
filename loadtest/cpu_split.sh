#!/usr/bin/env bash
# User and system CPU per request, side by side: each given Rolter binary (say, two builds
# of different commits) and, with --haproxy, HAProxy, each in turn pinned to CPU 1 with
# three mock engines and wrk on CPU 0; interleaved rounds of 8 s of a scenario-1 or
# scenario-2 load (after 2 s of warm-up); utime and stime from /proc/PID/stat.
# Needs the release binaries and a loadtest/run.sh result directory for the wrk scripts:
#   loadtest/cpu_split.sh [--rounds N] [--load stream|chat] [--haproxy] [BINARY...]
#   (default: 3 rounds of the streaming load, the release build's rolter)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=3; LOAD=stream; SYSTEMS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --load) LOAD=$2; shift ;;
    --haproxy) SYSTEMS+=(haproxy) ;;
    *) SYSTEMS+=("$(realpath "$1")") ;;
  esac
  shift
done
[ ${#SYSTEMS[@]} -eq 0 ] || [ "${SYSTEMS[*]}" = haproxy ] && SYSTEMS=("$B/rolter" "${SYSTEMS[@]}")
RES=$(ls -d "$ROOT"/loadtest/results/2*/ | tail -1)
L=$RES/wrk-$LOAD.lua
[ -f "$L" ] || { echo "no $L: run loadtest/run.sh --quick first" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
trap 'pkill -f "rolter-mock --listen 127.0.0.1:1900" || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
start_mocks --model m --tokens 64 --max-running 0
# Rolter's defaults, its access log (to stdout, here a file) included, as in loadtest/run.sh.
rolter_config rolter.toml 19700
haproxy_config haproxy.cfg 19700 19001 19002 19003
TICK=$(getconf CLK_TCK)
URL=http://127.0.0.1:19700/v1/chat/completions
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SYSTEMS[@]}"; do
    if [ "$s" = haproxy ]; then
      taskset -c 1 haproxy -f haproxy.cfg >haproxy.log 2>&1 &
    else
      ROLTER_LOG=warn taskset -c 1 "$s" run --config rolter.toml >rolter.log 2>&1 &
    fi
    pid=$!
    wait_listening 19700
    taskset -c 0 wrk -t1 -c32 -d2s -s "$L" $URL >/dev/null
    read -r u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat)
    out=$(taskset -c 0 timeout 40 wrk -t1 -c32 -d8s -s "$L" $URL)
    read -r u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat)
    n=$(echo "$out" | awk '/requests in/{print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
    python3 -c "import sys; u,s,n,t=map(float,sys.argv[1:5]); print(f'round $r $s req/s=$rps user={(u*1e6/t/n):.1f} sys={(s*1e6/t/n):.1f} total={((u+s)*1e6/t/n):.1f} us/req')" \
      $((u1 - u0)) $((s1 - s0)) "$n" "$TICK"
    kill $pid; wait $pid 2>/dev/null || true
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/19700) 2>/dev/null || break; sleep 0.1; done
  done
done
