#!/usr/bin/env bash
# User and system CPU per request, side by side: each given Rolter binary (say, two builds
# of different commits) and, with --haproxy, HAProxy, each in turn pinned to CPU 1 with
# three mock engines and wrk on CPU 0; interleaved rounds of 8 s of a scenario-1 or
# scenario-2 load (after 2 s of warm-up); utime and stime from /proc/PID/stat.
# Needs the release binaries and wrk (and HAProxy with --haproxy):
#   loadtest/cpu_split.sh [--rounds N] [--load stream|chat] [--haproxy] [--access-off]
#                         [--usage "ask count"] [--port P] [BINARY...]
#   (default: 3 rounds of the streaming load, the release build's rolter)
# --access-off turns Rolter's access log off (HAProxy's config logs nothing); --usage runs
# each Rolter binary once per `stream_usage` value given, as systems of their own
# (`BINARY:ask`, `BINARY:count`). The wrk scripts are the latest loadtest/run.sh result
# directory's, or the same ~1 KiB chat body written here when there is none.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=3; LOAD=stream; SYSTEMS=(); ACCESS=""; USAGE=""; PORT=19700
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --load) LOAD=$2; shift ;;
    --haproxy) SYSTEMS+=(haproxy) ;;
    --access-off) ACCESS=off ;;
    --usage) USAGE=$2; shift ;;
    --port) PORT=$2; shift ;;
    *) SYSTEMS+=("$(realpath "$1")") ;;
  esac
  shift
done
[ ${#SYSTEMS[@]} -eq 0 ] || [ "${SYSTEMS[*]}" = haproxy ] && SYSTEMS=("$B/rolter" "${SYSTEMS[@]}")
if [ -n "$USAGE" ]; then
  each=()
  for s in "${SYSTEMS[@]}"; do
    if [ "$s" = haproxy ]; then each+=(haproxy); continue; fi
    for u in $USAGE; do each+=("$s:$u"); done
  done
  SYSTEMS=("${each[@]}")
fi
RES=$(ls -d "$ROOT"/loadtest/results/2*/ 2>/dev/null | tail -1 || true)
L=${RES:+$RES/wrk-$LOAD.lua}
TMP=$(mktemp -d); cd "$TMP"
trap 'pkill -f "rolter-mock --listen 127.0.0.1:1900" || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
if [ -z "$L" ] || [ ! -f "$L" ]; then
  L=$TMP/wrk-$LOAD.lua
  case $LOAD in stream) chat_wrk_script "$L" true ;; *) chat_wrk_script "$L" false ;; esac
fi
start_mocks --model m --tokens 64 --max-running 0
# Rolter's defaults, its access log (to stdout, here a file) included, as in
# loadtest/run.sh, unless --access-off.
rolter_config rolter.toml "$PORT" $ACCESS
for u in ask count; do
  sed "s/^url = .*/&\nstream_usage = \"$u\"/" rolter.toml >"rolter-$u.toml"
done
haproxy_config haproxy.cfg "$PORT" 19001 19002 19003
TICK=$(getconf CLK_TCK)
URL=http://127.0.0.1:$PORT/v1/chat/completions
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SYSTEMS[@]}"; do
    if [ "$s" = haproxy ]; then
      taskset -c 1 haproxy -f haproxy.cfg >haproxy.log 2>&1 &
    else
      bin=${s%:*}; cfg=rolter.toml
      case $s in *:ask) cfg=rolter-ask.toml ;; *:count) cfg=rolter-count.toml ;; esac
      [ "$bin" = "$s" ] || [ -x "$bin" ] || { echo "no binary $bin" >&2; exit 2; }
      ROLTER_LOG=warn taskset -c 1 "$bin" run --config "$cfg" >rolter.log 2>&1 &
    fi
    pid=$!
    wait_listening "$PORT"
    taskset -c 0 wrk -t1 -c32 -d2s -s "$L" $URL >/dev/null
    read -r u0 s0 < <(awk '{print $14, $15}' /proc/$pid/stat)
    out=$(taskset -c 0 timeout 40 wrk -t1 -c32 -d8s -s "$L" $URL)
    read -r u1 s1 < <(awk '{print $14, $15}' /proc/$pid/stat)
    n=$(echo "$out" | awk '/requests in/{print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
    python3 -c "import sys; u,s,n,t=map(float,sys.argv[1:5]); print(f'round $r $s req/s=$rps user={(u*1e6/t/n):.1f} sys={(s*1e6/t/n):.1f} total={((u+s)*1e6/t/n):.1f} us/req')" \
      $((u1 - u0)) $((s1 - s0)) "$n" "$TICK"
    kill $pid; wait $pid 2>/dev/null || true
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null || break; sleep 0.1; done
  done
done
