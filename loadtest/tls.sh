#!/usr/bin/env bash
# The TLS scenario of the load-test harness (`loadtest/run.sh --tls` runs it): Rolter, nginx
# and HAProxy terminating client TLS with the same certificate (ECDSA P-256, made here with
# openssl), in front of the same mock engine, interleaved A B C per round:
#
#   tls_keepalive  wrk over https with keep-alive (one handshake per connection): req/s and
#                  the proxy's CPU time per request
#   tls_handshake  wrk over https with `Connection: close` (a full handshake per request,
#                  wrk does not resume sessions): handshakes/s and CPU per handshake
#
#   loadtest/tls.sh [--rounds N] [--duration S] [--connections N] [--workers N]
#                   [--systems "rolter nginx haproxy"] [--skip-build]
#
# Prints a Markdown table (median over rounds, min–max beside it) and writes it with the raw
# wrk outputs under loadtest/results/tls-<stamp>/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=3; DUR=8; CONNS=32; WORKERS=1; SYSTEMS="rolter nginx haproxy"; SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) DUR=3 ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    --skip-install) ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for v in ROUNDS DUR CONNS WORKERS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "tls.sh: --${v,,} must be a positive integer" >&2; exit 2; }
done
for s in $SYSTEMS; do
  case $s in rolter|nginx|haproxy) ;; *) echo "tls.sh: unknown system $s" >&2; exit 2 ;; esac
done

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
die() { printf 'tls.sh: error: %s\n' "$*" >&2; exit 1; }
export PATH="$PATH:/usr/sbin:/sbin"
for t in wrk nginx haproxy openssl taskset; do command -v $t >/dev/null || die "$t not found"; done

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$SKIP_BUILD" = 0 ]; then
  log "building rolter and rolter-mock (release)"
  cargo build --release -q -p rolter -p rolter-mock
fi
BIN=$(mktemp -d /tmp/rolter-tls-bin.XXXXXX)
cp "$TARGET/release/rolter" "$TARGET/release/rolter-mock" "$BIN/" || die "release binaries missing"

NCPU=$(nproc)
if [ "$NCPU" -lt 2 ]; then PROXY_CPUS=0; GEN_CPUS=0
else
  pw=$WORKERS; [ "$pw" -gt $((NCPU - 1)) ] && pw=$((NCPU - 1))
  PROXY_CPUS=$(seq -s, 1 "$pw"); GEN_CPUS=0
fi
LAYOUT="$NCPU CPUs: proxy on CPU $PROXY_CPUS; wrk and the mock engine on CPU $GEN_CPUS"

STAMP=$(date +%Y%m%d-%H%M%S)
OUT="$ROOT/loadtest/results/tls-$STAMP"; mkdir -p "$OUT/raw"
TMP=$(mktemp -d /tmp/rolter-tls.XXXXXX)
PIDS=()
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP" "$BIN"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port pid name
  local i
  for ((i = 0; i < 100; i++)); do
    port_open "$1" && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited at start (see $OUT/$3.log)"
    sleep 0.1
  done
  die "$3 did not listen on 127.0.0.1:$1"
}

# One certificate and key for every proxy (HAProxy wants both in one file).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/haproxy.pem"

MOCK_PORT=19401
declare -A PORT=([rolter]=19410 [nginx]=19420 [haproxy]=19430)
declare -A PID=()
for p in $MOCK_PORT 19410 19420 19430; do port_open "$p" && die "port $p is already in use"; done
taskset -c "$GEN_CPUS" "$BIN/rolter-mock" --listen "127.0.0.1:$MOCK_PORT" --name mock --model m \
  --tokens 16 --max-running 0 --threads 1 >"$OUT/mock.log" 2>&1 &
PIDS+=($!); wait_port $MOCK_PORT $! mock

cat >"$OUT/rolter.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[rolter]}"
workers = $WORKERS
pin_workers = false
max_connections = 100000
[server.tls]
cert_file = "$TMP/cert.pem"
key_file = "$TMP/key.pem"
[log]
access = "off"
[[targets]]
name = "mock"
url = "http://127.0.0.1:$MOCK_PORT"
EOF
ROLTER_LOG=warn taskset -c "$PROXY_CPUS" "$BIN/rolter" run --config "$OUT/rolter.toml" >"$OUT/rolter.log" 2>&1 &
PID[rolter]=$!; PIDS+=($!)

mp=off; [ "$WORKERS" -gt 1 ] && mp=on
cat >"$OUT/nginx.conf" <<EOF
master_process $mp;
worker_processes $WORKERS;
daemon off;
pid $TMP/nginx.pid;
error_log $OUT/nginx.log error;
events { worker_connections 20000; multi_accept on; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream mocks { server 127.0.0.1:$MOCK_PORT; keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:${PORT[nginx]} ssl reuseport;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    location / {
      proxy_pass http://mocks;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      tcp_nodelay on;
    }
  }
}
EOF
taskset -c "$PROXY_CPUS" nginx -c "$OUT/nginx.conf" -p "$TMP" -e "$OUT/nginx.log" >>"$OUT/nginx.log" 2>&1 &
PID[nginx]=$!; PIDS+=($!)

cat >"$OUT/haproxy.cfg" <<EOF
global
  nbthread $WORKERS
  maxconn 20000
  no strict-limits
defaults
  mode http
  option http-keep-alive
  option http-no-delay
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:${PORT[haproxy]} ssl crt $TMP/haproxy.pem alpn http/1.1
  default_backend be
backend be
  server mock 127.0.0.1:$MOCK_PORT
EOF
taskset -c "$PROXY_CPUS" haproxy -f "$OUT/haproxy.cfg" >"$OUT/haproxy.log" 2>&1 &
PID[haproxy]=$!; PIDS+=($!)
for s in $SYSTEMS; do wait_port "${PORT[$s]}" "${PID[$s]}" "$s"; done

BODY='{"model":"m","stream":false,"max_tokens":16,"messages":[{"role":"user","content":"Summarise the plot of a long novel in two sentences."}]}'
{ echo 'wrk.method = "POST"'; printf 'wrk.body = [[%s]]\n' "$BODY"
  echo 'wrk.headers["Content-Type"] = "application/json"'; } >"$OUT/keepalive.lua"
{ cat "$OUT/keepalive.lua"; echo 'wrk.headers["Connection"] = "close"'; } >"$OUT/handshake.lua"
# Every proxy must answer over TLS before anything is measured.
for s in $SYSTEMS; do
  curl -sS --fail -k -o /dev/null -H 'content-type: application/json' -d "$BODY" \
    "https://127.0.0.1:${PORT[$s]}/v1/chat/completions" || die "$s does not answer over TLS"
done

CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # utime + stime of a process and its children (nginx workers)
  local t=0 p v
  for p in "$1" $(pgrep -P "$1" || true); do
    v=$(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo "$t"
}
RESULTS="$OUT/results.tsv"; : >"$RESULTS"
# run ROUND SCENARIO SYSTEM LUA CONNS: one wrk run; records req/s and CPU µs per request.
run() {
  local r=$1 scen=$2 s=$3 lua=$4 c=$5 raw="$OUT/raw/r$1-$2-$3.txt" t0 t1 reqs rps errs
  t0=$(cpu_ticks "${PID[$s]}")
  timeout -k 5 $((DUR + 30)) taskset -c "$GEN_CPUS" wrk -t1 -c"$c" -d"${DUR}s" -s "$lua" \
    "https://127.0.0.1:${PORT[$s]}/v1/chat/completions" >"$raw" 2>&1 || die "wrk against $s failed (see $raw)"
  t1=$(cpu_ticks "${PID[$s]}")
  reqs=$(awk '/requests in/ {print $1}' "$raw"); rps=$(awk '/Requests\/sec/ {print $2}' "$raw")
  errs=$(awk '/Non-2xx|Socket errors/ {print}' "$raw" | tr '\n' ' ')
  [ -n "$reqs" ] && [ "$reqs" -gt 0 ] || die "no requests in $raw"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$scen" "$s" "$rps" \
    "$(awk -v t=$((t1 - t0)) -v k="$CLK_TCK" -v n="$reqs" 'BEGIN {printf "%.1f", t / k * 1e6 / n}')" "$errs" >>"$RESULTS"
}

log "pinning: $LAYOUT"
for s in $SYSTEMS; do   # warm-up, not recorded
  timeout -k 5 30 taskset -c "$GEN_CPUS" wrk -t1 -c"$CONNS" -d1s -s "$OUT/keepalive.lua" \
    "https://127.0.0.1:${PORT[$s]}/v1/chat/completions" >/dev/null || die "warm-up against $s failed"
done
for r in $(seq 1 "$ROUNDS"); do
  log "round $r/$ROUNDS: tls_keepalive"
  for s in $SYSTEMS; do run "$r" tls_keepalive "$s" "$OUT/keepalive.lua" "$CONNS"; done
  log "round $r/$ROUNDS: tls_handshake"
  for s in $SYSTEMS; do run "$r" tls_handshake "$s" "$OUT/handshake.lua" "$CONNS"; done
done

# Median (and range) over the rounds per scenario and system.
{
  echo "TLS scenario: $(date -u +'%Y-%m-%d %H:%M UTC'); $LAYOUT; $ROUNDS rounds, $DUR s per run, $CONNS connections, $WORKERS worker(s) per proxy"
  echo "Command: loadtest/run.sh --tls --rounds $ROUNDS --duration $DUR --connections $CONNS --workers $WORKERS"
  echo "Versions: $(nginx -v 2>&1 | head -1); $(haproxy -v 2>&1 | head -1); $(wrk -v 2>&1 | head -1); $(openssl version)"
  echo
  echo "| scenario | system | req/s (median, min–max) | proxy CPU µs per request (median, min–max) | wrk errors |"
  echo "|---|---|---|---|---|"
  for scen in tls_keepalive tls_handshake; do
    for s in $SYSTEMS; do
      awk -F'\t' -v sc="$scen" -v sy="$s" '
        $2 == sc && $3 == sy { n++; rps[n] = $4; cpu[n] = $5; if ($6 != "") err = err $6 }
        function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
          return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        END { if (!n) exit; lo = rps[1]; hi = rps[1]; for (i = 1; i <= n; i++) { if (rps[i] < lo) lo = rps[i]; if (rps[i] > hi) hi = rps[i] }
          clo = cpu[1]; chi = cpu[1]; for (i = 1; i <= n; i++) { if (cpu[i] < clo) clo = cpu[i]; if (cpu[i] > chi) chi = cpu[i] }
          printf "| %s | %s | %.0f (%.0f–%.0f) | %.1f (%.1f–%.1f) | %s |\n", sc, sy, med(rps, n), lo, hi, med(cpu, n), clo, chi, (err == "" ? "none" : err) }' "$RESULTS"
    done
  done
} | tee "$OUT/report.md"
log "results: $OUT/report.md, results.tsv, raw/"
