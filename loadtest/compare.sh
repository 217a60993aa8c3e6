#!/usr/bin/env bash
# Side-by-side, non-streaming: the mock engine directly, through Rolter, and through nginx
# and HAProxy, with the same upstream and one worker each. Interleaved rounds (D R N H D R N H…),
# each a bounded wrk run against loopback. Reports requests/s, latency and the proxy's CPU
# time per request (from /proc/PID/stat), which is the steadiest figure on a shared machine.
#
#   loadtest/compare.sh [rounds] [seconds] [connections]
#
# Pinning: proxies on CPU 1; wrk and the mock engine on CPU 0 (a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-8}
CONNS=${3:-32}
OUT=loadtest/results
mkdir -p "$OUT"

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
cargo build --release -q -p rolter -p rolter-mock

MOCK_PORT=19001; ROLTER_PORT=19100; NGINX_PORT=19200; HAPROXY_PORT=19300
TMP=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

taskset -c 0 target/release/rolter-mock --listen 127.0.0.1:$MOCK_PORT --name bench --model m --tokens 16 >/dev/null &
pids+=($!)

cat > "$TMP/rolter.toml" <<TOML
[server]
listen = "127.0.0.1:$ROLTER_PORT"
workers = 1
pin_workers = false
[[targets]]
name = "mock"
url = "http://127.0.0.1:$MOCK_PORT"
TOML
ROLTER_LOG=warn taskset -c 1 target/release/rolter run --config "$TMP/rolter.toml" &
ROLTER_PID=$!; pids+=($ROLTER_PID)

cat > "$TMP/nginx.conf" <<NGX
worker_processes 1;
master_process off;
daemon off;
pid $TMP/nginx.pid;
error_log /dev/null crit;
events { worker_connections 4096; }
http {
  access_log off;
  upstream mock { server 127.0.0.1:$MOCK_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGX
taskset -c 1 nginx -c "$TMP/nginx.conf" -e /dev/null &
NGINX_PID=$!; pids+=($NGINX_PID)

cat > "$TMP/haproxy.cfg" <<HAP
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-no-delay
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend be
backend be
  server mock 127.0.0.1:$MOCK_PORT
HAP
taskset -c 1 haproxy -f "$TMP/haproxy.cfg" -q &
HAPROXY_PID=$!; pids+=($HAPROXY_PID)
sleep 1

body='{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"'$(printf 'You are a helpful assistant. %.0s' {1..28})'"},{"role":"user","content":"Summarise the plot of a long novel in two sentences."}]}'
cat > "$TMP/post.lua" <<LUA
wrk.method = "POST"
wrk.body = [[$body]]
wrk.headers["Content-Type"] = "application/json"
LUA

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)

run() { # name port pid
  local name=$1 port=$2 pid=$3 before after out rps lat
  [ -n "$pid" ] && before=$(cpu_ticks "$pid")
  out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$TMP/post.lua" "http://127.0.0.1:$port/v1/chat/completions")
  [ -n "$pid" ] && after=$(cpu_ticks "$pid")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  cpu_us="-"
  if [ -n "$pid" ]; then cpu_us=$(awk -v a="$after" -v b="$before" -v t="$TCK" -v n="$reqs" 'BEGIN{printf "%.1f", (a-b)/t*1e6/n}'); fi
  printf '%-8s %10s %10s %10s %12s\n' "$name" "$rps" "$p50" "$p99" "$cpu_us"
}

printf '%-8s %10s %10s %10s %12s\n' system req/s p50 p99 cpu_us/req | tee "$OUT/compare.txt"
for r in $(seq 1 "$ROUNDS"); do
  run direct  $MOCK_PORT    ""            | tee -a "$OUT/compare.txt"
  run rolter  $ROLTER_PORT  $ROLTER_PID   | tee -a "$OUT/compare.txt"
  run nginx   $NGINX_PORT   $NGINX_PID    | tee -a "$OUT/compare.txt"
  run haproxy $HAPROXY_PORT $HAPROXY_PID  | tee -a "$OUT/compare.txt"
done
