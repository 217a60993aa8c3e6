#!/usr/bin/env bash
# Rolter's load-test harness: Rolter side by side with nginx, HAProxy and a direct
# connection to the mock engine (the physical limit), on loopback, interleaved.
#
#   loadtest/run.sh            # default: 3 rounds, 8 s per load, ~12 min (+ first oha build)
#   loadtest/run.sh --quick    # 3 rounds, 2 s per load, ~3 min
#   loadtest/run.sh --tls      # the TLS scenario instead (loadtest/tls.sh): rolter, nginx and
#                              # HAProxy terminating TLS, req/s, CPU per request, handshakes/s
#   loadtest/run.sh --kernel-ops  # instead: system calls and io_uring submissions per
#                              # request, per SSE event and per idle connection (perf)
#   loadtest/run.sh --help     # all options
#
# See docs/benchmarks.md for what each scenario measures. Results: loadtest/results/<stamp>/
# (report.md, report.json, runs.jsonl, raw tool outputs) and loadtest/results/latest.{md,json}.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# --tls: the TLS scenario, with the remaining options (rounds, duration, connections,
# workers, systems, --quick, --skip-build).
for a in "$@"; do
  if [ "$a" = --tls ]; then
    rest=(); for b in "$@"; do [ "$b" = --tls ] || rest+=("$b"); done
    exec "$ROOT/loadtest/tls.sh" "${rest[@]}"
  fi
done

usage() {
  cat <<'EOF'
usage: loadtest/run.sh [options]

  --quick               short run (~3 min): 2 s loads, fewer stream samples, shorter slow streams
  --rounds N            rounds of interleaved load scenarios (default 3, at least 3 advised)
  --duration S          seconds per load run (default 8; quick 2)
  --connections N       connections for scenarios 1 and 2 (default 32)
  --workers N           worker cores per proxy (default 1)
  --rate R              open-loop rate for scenario 4 in req/s (default: 60 % of the slowest
                        proxy's scenario-1 wrk req/s in round 1)
  --systems "LIST"      subset/order of: direct rolter nginx haproxy rolter_busy (default the
                        first four; rolter_busy is Rolter with [server] busy_poll)
  --busy-poll D         rolter_busy's busy_poll (default 1ms)
  --access-log WHERE    Rolter's access log: off (the default, as nginx's and HAProxy's
                        here), or a path
  --idle-conns N        idle keep-alive connections in scenario 6 (default 10000)
  --slow-conns N        concurrent slow streams in scenario 6 (default 1000)
  --mem-rounds N        rounds of scenario 6 (default 3; quick 1)
  --skip-install        do not install wrk/nginx/haproxy/oha (fail if missing)
  --skip-build          do not run cargo build (use the existing release binaries)
  --body-kib N          request bodies of about N KiB (a longer system prompt; default 1):
                        `--body-kib 32` is the big-prompt case (RAG, long chats)
  --scenarios "LIST"    subset/order of: s1_wrk s1_oha s2_stream s3_ttfb s4_open (default all)
  --mem-rounds 0        skip scenario 6 (memory)
  --kernel-ops          instead of the scenarios: count system calls and io_uring submissions
                        (perf tracepoints on the proxy's threads) per non-streaming request,
                        per streamed SSE event and per idle keep-alive connection
  --tls                 run the TLS scenario (loadtest/tls.sh) instead: rolter, nginx and
                        HAProxy terminating TLS with one certificate; keep-alive req/s and CPU
                        per request, and a handshake per request for handshakes/s
  -h, --help            this text

Environment: CARGO_TARGET_DIR is honoured; OHA=/path/to/oha uses that oha.
EOF
}

# ---------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------
QUICK=0; ROUNDS=3; DUR=""; CONNS=32; WORKERS=1; RATE=auto; KERNEL_OPS=0; BODY_KIB=1
SCENARIOS="s1_wrk s1_oha s2_stream s3_ttfb s4_open"
SYSTEMS="direct rolter nginx haproxy"; IDLE_CONNS=10000; SLOW_CONNS=1000; MEM_ROUNDS=""
SKIP_INSTALL=0; SKIP_BUILD=0; BUSY_POLL=1ms; ROLTER_ACCESS=off
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --access-log) ROLTER_ACCESS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --idle-conns) IDLE_CONNS=$2; shift ;;
    --slow-conns) SLOW_CONNS=$2; shift ;;
    --mem-rounds) MEM_ROUNDS=$2; shift ;;
    --skip-install) SKIP_INSTALL=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --kernel-ops) KERNEL_OPS=1 ;;
    --body-kib) BODY_KIB=$2; shift ;;
    --busy-poll) BUSY_POLL=$2; shift ;;
    --scenarios) SCENARIOS=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [ "$QUICK" = 1 ]; then
  DUR=${DUR:-2}; MEM_ROUNDS=${MEM_ROUNDS:-1}
  S3_REQS=40; SLOW_TOKENS=40; WARM_SECS=1
else
  DUR=${DUR:-8}; MEM_ROUNDS=${MEM_ROUNDS:-3}
  S3_REQS=100; SLOW_TOKENS=100; WARM_SECS=2
fi
SLOW_ITL_MS=50          # scenario 6: slow streams, 50 ms between tokens
S3_TOKENS=16; S3_ITL_MS=3; S3_TTFT_MS=2   # scenario 3: head at once, first token after 2 ms, 16 tokens 3 ms apart
S2_TOKENS=64            # scenario 2: 64 tokens, no delay
OPEN_CONNS=64           # scenario 4: connections available to the open-loop generator
for v in ROUNDS DUR CONNS WORKERS IDLE_CONNS SLOW_CONNS BODY_KIB; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --${v,,} must be a positive integer" >&2; exit 2; }
done
[[ $MEM_ROUNDS =~ ^[0-9]+$ ]] || { echo "run.sh: --mem-rounds must be a number" >&2; exit 2; }
for s in $SCENARIOS; do
  case $s in s1_wrk|s1_oha|s2_stream|s3_ttfb|s4_open) ;; *) echo "run.sh: unknown scenario $s" >&2; exit 2 ;; esac
done
[[ $RATE == auto || $RATE =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rate must be a positive integer" >&2; exit 2; }
for s in $SYSTEMS; do
  case $s in direct|rolter|nginx|haproxy|rolter_busy) ;; *) echo "run.sh: unknown system $s" >&2; exit 2 ;; esac
done

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
die() { printf 'run.sh: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------
# Tools: wrk, nginx, HAProxy from the distribution; oha from crates.io (cached)
# ---------------------------------------------------------------------------------------
TOOLS="$ROOT/loadtest/.tools"
if [ "$SKIP_INSTALL" = 0 ]; then
  need=()
  command -v wrk >/dev/null || need+=(wrk)
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    log "installing ${need[*]} (apt-get)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"
# oha runs scenarios 1 (oha) and 4 only: without them it is neither built nor required.
NEED_OHA=0
if [ "$KERNEL_OPS" = 0 ]; then
  for s in $SCENARIOS; do case $s in s1_oha|s4_open) NEED_OHA=1 ;; esac; done
fi
OHA=${OHA:-}
if [ -z "$OHA" ] && [ "$NEED_OHA" = 1 ]; then
  if [ -x "$TOOLS/bin/oha" ]; then OHA="$TOOLS/bin/oha"
  elif command -v oha >/dev/null; then OHA=$(command -v oha)
  elif [ "$SKIP_INSTALL" = 0 ]; then
    log "building oha with cargo install --locked into $TOOLS (first run only: about 8 minutes)"
    cargo install oha --locked --root "$TOOLS" --quiet
    OHA="$TOOLS/bin/oha"
  fi
fi
for t in wrk nginx haproxy taskset; do command -v $t >/dev/null || die "$t not found"; done
OHA_JSON=(-j); OHA_LC=()
if [ "$NEED_OHA" = 1 ]; then
  [ -n "$OHA" ] && [ -x "$OHA" ] || die "oha not found (run without --skip-install, or set OHA=)"
  if "$OHA" --help 2>&1 | grep -q -- '--output-format'; then OHA_JSON=(--output-format json); fi
  "$OHA" --help 2>&1 | grep -q -- '--latency-correction' && OHA_LC=(--latency-correction)
fi

# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$SKIP_BUILD" = 0 ]; then
  log "building rolter, rolter-mock and rolter-loadclient (release)"
  cargo build --release -q -p rolter -p rolter-mock -p rolter-loadclient
fi
ROLTER="$TARGET/release/rolter"; MOCK="$TARGET/release/rolter-mock"; LC="$TARGET/release/rolter-loadclient"
for b in "$ROLTER" "$MOCK" "$LC"; do [ -x "$b" ] || die "$b missing (build first)"; done
# Copies, so that a rebuild during the run cannot swap a binary between rounds.
BIN=$(mktemp -d /tmp/rolter-loadtest-bin.XXXXXX)
cp "$ROLTER" "$MOCK" "$LC" "$BIN/"
ROLTER="$BIN/rolter"; MOCK="$BIN/rolter-mock"; LC="$BIN/rolter-loadclient"

# ---------------------------------------------------------------------------------------
# Limits and CPU layout
# ---------------------------------------------------------------------------------------
HARD_NOFILE=$(ulimit -Hn)
[ "$HARD_NOFILE" = unlimited ] && HARD_NOFILE=1048576
ulimit -n "$HARD_NOFILE"        # inherited by every proxy, mock and client started below
if [ $((IDLE_CONNS + 1000)) -gt "$HARD_NOFILE" ]; then
  IDLE_CONNS=$((HARD_NOFILE - 1000))
  log "WARNING: fd limit $HARD_NOFILE: scenario 6 holds $IDLE_CONNS idle connections instead"
fi

NCPU=$(nproc)
range() { local a=$1 b=$2 out="" i; for ((i = a; i <= b; i++)); do out+="${out:+,}$i"; done; echo "$out"; }
if [ "$NCPU" -lt 2 ]; then
  PROXY_CPUS=0; GEN_CPUS=0; MOCK_CPUS=0
  LAYOUT="1 CPU: everything shares CPU 0 (no isolation; figures are indicative only)"
else
  pw=$WORKERS; [ "$pw" -gt $((NCPU - 1)) ] && pw=$((NCPU - 1))
  PROXY_CPUS=$(range 1 "$pw")
  rest=(0); for ((i = pw + 1; i < NCPU; i++)); do rest+=("$i"); done
  if [ ${#rest[@]} -ge 2 ]; then
    half=$(((${#rest[@]} + 1) / 2))
    GEN_CPUS=$(IFS=,; echo "${rest[*]:0:$half}"); MOCK_CPUS=$(IFS=,; echo "${rest[*]:$half}")
  else
    GEN_CPUS=0; MOCK_CPUS=0
  fi
  LAYOUT="$NCPU CPUs: proxy (${WORKERS} worker(s)) on CPU $PROXY_CPUS; load generators on CPU $GEN_CPUS; mock engines on CPU $MOCK_CPUS (taskset -c)"
fi
log "pinning: $LAYOUT"
log "fd limit: $HARD_NOFILE; idle connections: $IDLE_CONNS; slow streams: $SLOW_CONNS"

# ---------------------------------------------------------------------------------------
# Processes (always cleaned up)
# ---------------------------------------------------------------------------------------
STAMP=$(date +%Y%m%d-%H%M%S)
OUT="$ROOT/loadtest/results/$STAMP"
mkdir -p "$OUT/raw"
RUNS="$OUT/runs.jsonl"; : > "$RUNS"
TMP=$(mktemp -d /tmp/rolter-loadtest.XXXXXX)
PIDS=()
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
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
  die "$3 did not listen on 127.0.0.1:$1 within 10 s (see $OUT/$3.log)"
}

MOCK_PORTS=(19001 19002 19003)
declare -A MOCK_PID=()
declare -A PORT=([direct]=19001 [rolter]=19100 [nginx]=19200 [haproxy]=19300 [rolter_busy]=19400)
declare -A PID=()
for p in "${MOCK_PORTS[@]}" 19100 19200 19300; do port_open "$p" && die "port $p is already in use"; done

i=0
for p in "${MOCK_PORTS[@]}"; do
  i=$((i + 1))
  taskset -c "$MOCK_CPUS" "$MOCK" --listen "127.0.0.1:$p" --name "mock$i" --model m \
    --tokens $S2_TOKENS --max-running 0 --threads 1 >"$OUT/mock$i.log" 2>&1 &
  PIDS+=($!); MOCK_PID[$i]=$!; wait_port "$p" $! "mock$i"
done

UPSTREAMS_ROLTER=""; UPSTREAMS_NGINX=""; UPSTREAMS_HAP=""
i=0
for p in "${MOCK_PORTS[@]}"; do
  i=$((i + 1))
  UPSTREAMS_ROLTER+=$'\n'"[[targets]]"$'\n'"name = \"mock$i\""$'\n'"url = \"http://127.0.0.1:$p\""$'\n'
  UPSTREAMS_NGINX+="    server 127.0.0.1:$p;"$'\n'
  UPSTREAMS_HAP+="  server mock$i 127.0.0.1:$p"$'\n'
done
MAXCONN=$((IDLE_CONNS + 2 * SLOW_CONNS + 1000))

# start_rolter [rolter|rolter_busy]: rolter_busy adds [server] busy_poll.
start_rolter() {
  local sys=${1:-rolter} busy=""
  [ "$sys" = rolter_busy ] && busy="busy_poll = \"$BUSY_POLL\""
  cat >"$OUT/$sys.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[$sys]}"
workers = $WORKERS
pin_workers = false   # taskset confines the process to CPU $PROXY_CPUS
$busy
[log]
access = "$ROLTER_ACCESS"
$UPSTREAMS_ROLTER
[[routes]]
name = "all"
targets = ["mock1", "mock2", "mock3"]
strategy = "round_robin"
EOF
  ROLTER_LOG=warn taskset -c "$PROXY_CPUS" "$ROLTER" run --config "$OUT/$sys.toml" >"$OUT/$sys.log" 2>&1 &
  PID[$sys]=$!; PIDS+=($!); wait_port "${PORT[$sys]}" $! "$sys"
}

start_nginx() {
  local mp=off; [ "$WORKERS" -gt 1 ] && mp=on
  cat >"$OUT/nginx.conf" <<EOF
# master_process off with one worker: one process does all the work (CPU from its /proc).
master_process $mp;
worker_processes $WORKERS;
worker_rlimit_nofile $HARD_NOFILE;
daemon off;
pid $TMP/nginx.pid;
error_log $OUT/nginx.log error;
events { worker_connections $MAXCONN; multi_accept on; }
http {
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 1000000;
  upstream mocks {
$UPSTREAMS_NGINX    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:${PORT[nginx]} reuseport;
    client_body_buffer_size 64k;
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
  PID[nginx]=$!; PIDS+=($!); wait_port "${PORT[nginx]}" $! nginx
}

start_haproxy() {
  cat >"$OUT/haproxy.cfg" <<EOF
global
  nbthread $WORKERS
  maxconn $MAXCONN
  # 10k idle clients need maxconn > 10k, which HAProxy sizes as 2 fds each: over a 20k fd
  # limit it refuses to start unless limits are advisory (idle clients hold 1 fd each).
  no strict-limits
defaults
  mode http
  option http-keep-alive
  option http-no-delay      # relay SSE events as they come (otherwise held until the end)
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
frontend fe
  bind 127.0.0.1:${PORT[haproxy]}
  maxconn $MAXCONN
  default_backend be
backend be
  balance roundrobin
$UPSTREAMS_HAP
EOF
  taskset -c "$PROXY_CPUS" haproxy -f "$OUT/haproxy.cfg" >"$OUT/haproxy.log" 2>&1 &
  PID[haproxy]=$!; PIDS+=($!); wait_port "${PORT[haproxy]}" $! haproxy
}

start_system() {
  case $1 in
    rolter|rolter_busy) start_rolter "$1" ;;
    nginx) start_nginx ;;
    haproxy) start_haproxy ;;
  esac
}
stop_system() { # stop a proxy and wait for it to go
  local p=${PID[$1]} i
  kill "$p" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
  local keep=() q
  for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
  PIDS=("${keep[@]}")
  for ((i = 0; i < 50; i++)); do port_open "${PORT[$1]}" || break; sleep 0.1; done
}
for s in $SYSTEMS; do start_system "$s"; done
log "started: mocks on ${MOCK_PORTS[*]}; $(for s in $SYSTEMS; do printf '%s :%s  ' "$s" "${PORT[$s]}"; done)"

# ---------------------------------------------------------------------------------------
# Measurement helpers: /proc
# ---------------------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
sut_pids() { # sets SUT: the processes whose CPU and memory count for a system (none for direct)
  SUT=()
  local s=$1
  [ "$s" = direct ] && return 0
  local p=${PID[$s]}
  kill -0 "$p" 2>/dev/null || die "$s (pid $p) is no longer running (see $OUT/$s.log)"
  SUT=("$p")
  if [ "$s" = nginx ]; then mapfile -t -O 1 SUT < <(pgrep -P "$p" || true); fi
}
cpu_ticks() { # utime + stime of the given pids
  local t=0 p v
  for p in "$@"; do
    v=$(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo "$t"
}
status_kb() { # field pid...  (VmRSS, VmHWM): summed
  local f=$1 t=0 p v; shift
  for p in "$@"; do
    v=$(awk -v f="$f:" '$1 == f {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    t=$((t + ${v:-0}))
  done
  echo "$t"
}
steal_read() { awk '$1 == "cpu" {t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t}' /proc/stat; }
steal_pct() { # "steal total" before, after
  awk -v a="$1" -v b="$2" 'BEGIN {split(a, x, " "); split(b, y, " "); d = y[2] - x[2];
    printf "%.3f", (d > 0 ? (y[1] - x[1]) * 100 / d : 0)}'
}

FAILURES=0
fail() { FAILURES=$((FAILURES + 1)); printf 'run.sh: FAILED: %s\n' "$*" >&2; }

# measure ROUND SCENARIO SYSTEM TOOL RAW -- command...
# Runs the command (its stdout goes to RAW) and records it with CPU ticks, steal and RSS.
measure() {
  local round=$1 scen=$2 sys=$3 tool=$4 raw=$5; shift 6
  local pids t0 t1 s0 s1 sets=()
  sut_pids "$sys"; pids=("${SUT[@]}")
  t0=$(cpu_ticks "${pids[@]}"); s0=$(steal_read)
  if ! "$@" >"$raw" 2>"$raw.err"; then
    fail "$scen $sys round $round: $* (see $raw.err)"; return 0
  fi
  t1=$(cpu_ticks "${pids[@]}"); s1=$(steal_read)
  sets=(--set "steal_pct=$(steal_pct "$s0" "$s1")")
  if [ ${#pids[@]} -gt 0 ]; then
    sets+=(--set "cpu_ticks=$((t1 - t0))" --set "clk_tck=$CLK_TCK"
           --set "rss_kb=$(status_kb VmRSS "${pids[@]}")" --set "hwm_kb=$(status_kb VmHWM "${pids[@]}")")
  fi
  "$LC" record --runs "$RUNS" --tool "$tool" --raw "$raw" --round "$round" --scenario "$scen" \
    --system "$sys" "${sets[@]}" || fail "$scen $sys round $round: cannot parse $raw"
}

# ---------------------------------------------------------------------------------------
# Request bodies (~1 KiB chat completion)
# ---------------------------------------------------------------------------------------
body() { # stream max_tokens: about BODY_KIB KiB (a system prompt of 29-byte sentences)
  local n=$((BODY_KIB * 1024 / 29 - 7)); [ "$n" -lt 1 ] && n=1
  printf '{"model":"m","stream":%s,"max_tokens":%s,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"Summarise the plot of a long novel in two sentences."}]}' \
    "$1" "$2" "$(for ((k = 0; k < n; k++)); do printf 'You are a helpful assistant. '; done)"
}
body false 16 >"$OUT/body-chat.json"
body true $S2_TOKENS >"$OUT/body-stream.json"
for f in chat stream; do
  { echo 'wrk.method = "POST"'
    printf 'wrk.body = [[%s]]\n' "$(cat "$OUT/body-$f.json")"
    echo 'wrk.headers["Content-Type"] = "application/json"'; } >"$OUT/wrk-$f.lua"
done
url() { echo "http://127.0.0.1:${PORT[$1]}/v1/chat/completions"; }
LIMIT=$((DUR + 30))   # every load is bounded: the tool's own duration, and timeout(1) as a backstop

run_s1_wrk() { measure "$1" s1_wrk "$2" wrk "$OUT/raw/r$1-s1_wrk-$2.txt" -- \
  timeout -k 5 $LIMIT taskset -c "$GEN_CPUS" wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s "$OUT/wrk-chat.lua" "$(url "$2")"; }
run_s1_oha() { measure "$1" s1_oha "$2" oha "$OUT/raw/r$1-s1_oha-$2.json" -- \
  timeout -k 5 $LIMIT taskset -c "$GEN_CPUS" "$OHA" --no-tui "${OHA_JSON[@]}" -w -z "${DUR}s" -c "$CONNS" \
  -m POST -H 'Content-Type: application/json' -D "$OUT/body-chat.json" "$(url "$2")"; }
run_s2_stream() { measure "$1" s2_stream "$2" wrk "$OUT/raw/r$1-s2_stream-$2.txt" -- \
  timeout -k 5 $LIMIT taskset -c "$GEN_CPUS" wrk -t1 -c"$CONNS" -d"${DUR}s" --latency -s "$OUT/wrk-stream.lua" "$(url "$2")"; }
run_s3_ttfb() { measure "$1" s3_ttfb "$2" stream "$OUT/raw/r$1-s3_ttfb-$2.json" -- \
  timeout -k 5 $((DUR + 60)) taskset -c "$GEN_CPUS" "$LC" stream --addr "127.0.0.1:${PORT[$2]}" \
  --requests $S3_REQS --warmup 5 --max-secs $((DUR + 40)) --tokens $S3_TOKENS --itl-ms $S3_ITL_MS --ttft-ms $S3_TTFT_MS; }
run_s4_open() { measure "$1" s4_open "$2" oha "$OUT/raw/r$1-s4_open-$2.json" -- \
  timeout -k 5 $LIMIT taskset -c "$GEN_CPUS" "$OHA" --no-tui "${OHA_JSON[@]}" -w -z "${DUR}s" -c $OPEN_CONNS \
  -q "$RATE" "${OHA_LC[@]}" -m POST -H 'Content-Type: application/json' -D "$OUT/body-chat.json" "$(url "$2")"; }

wait_file() { # file pid seconds
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    [ -e "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# Scenario 6a: RSS with N idle keep-alive client connections (one request each).
run_s6_idle() {
  local round=$1 sys=$2 raw="$OUT/raw/r$1-s6_idle-$2.json" pids base rss hwm cpid rc=0
  sut_pids "$sys"; pids=("${SUT[@]}")
  base=$(status_kb VmRSS "${pids[@]}")
  rm -f "$TMP/ready" "$TMP/release"
  taskset -c "$GEN_CPUS" "$LC" hold --addr "127.0.0.1:${PORT[$sys]}" --conns "$IDLE_CONNS" --hold-secs 120 \
    --ready-file "$TMP/ready" --release-file "$TMP/release" --out "$raw" 2>"$raw.err" &
  cpid=$!; PIDS+=($cpid)
  if wait_file "$TMP/ready" $cpid 120; then
    sleep 0.5
    rss=$(status_kb VmRSS "${pids[@]}"); hwm=$(status_kb VmHWM "${pids[@]}")
  fi
  touch "$TMP/release"
  wait $cpid || rc=$?
  if [ $rc != 0 ] || [ -z "${rss:-}" ]; then fail "s6_idle $sys round $round (see $raw.err)"; return 0; fi
  "$LC" record --runs "$RUNS" --tool hold --raw "$raw" --round "$round" --scenario s6_idle --system "$sys" \
    --set "base_rss_kb=$base" --set "rss_kb=$rss" --set "hwm_kb=$hwm" || fail "s6_idle $sys: cannot parse $raw"
  sleep 1   # let the proxy reap 10k closed connections before the next measurement
}

# Scenario 6b: RSS with N concurrent slow streams.
run_s6_slow() {
  local round=$1 sys=$2 raw="$OUT/raw/r$1-s6_slow-$2.json" pids base peak=0 v hwm cpid rc=0
  sut_pids "$sys"; pids=("${SUT[@]}")
  base=$(status_kb VmRSS "${pids[@]}")
  rm -f "$TMP/ready"
  timeout -k 5 $((SLOW_TOKENS * SLOW_ITL_MS / 1000 + 90)) taskset -c "$GEN_CPUS" "$LC" slow \
    --addr "127.0.0.1:${PORT[$sys]}" --conns "$SLOW_CONNS" --tokens "$SLOW_TOKENS" --itl-ms $SLOW_ITL_MS \
    --ready-file "$TMP/ready" --out "$raw" 2>"$raw.err" &
  cpid=$!; PIDS+=($cpid)
  local samples=()
  while kill -0 $cpid 2>/dev/null; do   # sample the proxy's RSS while the streams run
    v=$(status_kb VmRSS "${pids[@]}"); [ "$v" -gt "$peak" ] && peak=$v
    [ -f "$TMP/ready" ] && samples+=("$v")
    sleep 0.1
  done
  # The peak includes the moment every stream opened at once; the median, the streams'
  # steady state.
  local median
  median=$(printf '%s\n' "${samples[@]:-$peak}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  wait $cpid || rc=$?
  hwm=$(status_kb VmHWM "${pids[@]}")
  if [ $rc != 0 ]; then fail "s6_slow $sys round $round (see $raw.err)"; return 0; fi
  "$LC" record --runs "$RUNS" --tool slow --raw "$raw" --round "$round" --scenario s6_slow --system "$sys" \
    --set "base_rss_kb=$base" --set "peak_rss_kb=$peak" --set "median_rss_kb=$median" --set "hwm_kb=$hwm" || fail "s6_slow $sys: cannot parse $raw"
}

# ---------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------
T_START=$(date +%s)
log "warm-up: ${WARM_SECS} s of scenario 1 per system (not recorded)"
for s in $SYSTEMS; do
  timeout -k 5 30 taskset -c "$GEN_CPUS" wrk -t1 -c"$CONNS" -d"${WARM_SECS}s" -s "$OUT/wrk-chat.lua" "$(url "$s")" >/dev/null \
    || die "warm-up against $s failed"
done

# --kernel-ops: per system, perf counts the system calls (raw_syscalls:sys_enter) and
# io_uring submissions (io_uring:io_uring_submit_req) of the proxy's threads while wrk runs
# DUR seconds of scenario 1 (non-streaming), of scenario 2 (64-token streams, no delay: the
# engine's events arrive together) and of 64-token streams with 2 ms between tokens (each
# event its own read and write: the per-event cost), and while 1000 idle keep-alive
# connections (one request each) sit for 10 s. "direct" counts the mock engine itself.
kops() { # out-file pid... -- command : perf stat on the pids while the command runs
  local out=$1; shift; local pids=()
  while [ "$1" != -- ]; do pids+=("$1"); shift; done; shift
  perf stat -x, -e raw_syscalls:sys_enter,io_uring:io_uring_submit_req \
    -p "$(IFS=,; echo "${pids[*]}")" -o "$out" -- "$@"
}
kops_get() { awk -F, -v e="$2" '$3 == e {print $1}' "$1"; }
per() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
if [ "$KERNEL_OPS" = 1 ]; then
  command -v perf >/dev/null || die "perf not found (apt-get install linux-perf)"
  { cat "$OUT/wrk-stream.lua"; echo 'wrk.headers["x-mock-itl-ms"] = "2"'; } >"$OUT/wrk-paced.lua"
  KO="$OUT/kernel-ops.md"
  { echo "| system | syscalls / request | SQEs / request | syscalls / stream (64 events together) | SQEs / stream | syscalls / SSE event (paced) | SQEs / SSE event | syscalls / s, 1000 idle conns | SQEs / s idle |"
    echo "|---|---|---|---|---|---|---|---|---|"; } >"$KO"
  for s in $SYSTEMS; do
    if [ "$s" = direct ]; then pids=("${MOCK_PID[1]}"); else sut_pids "$s"; pids=("${SUT[@]}"); fi
    declare -A got=()
    for f in chat stream paced; do
      kops "$OUT/raw/kops-$s-$f.txt" "${pids[@]}" -- timeout -k 5 $LIMIT taskset -c "$GEN_CPUS" \
        wrk -t1 -c"$CONNS" -d"${DUR}s" -s "$OUT/wrk-$f.lua" "$(url "$s")" >"$OUT/raw/kops-$s-$f.wrk" 2>&1 \
        || die "kernel-ops: $f against $s failed (see $OUT/raw/kops-$s-$f.wrk)"
      n=$(awk '/requests in/ {print $1}' "$OUT/raw/kops-$s-$f.wrk")
      # A paced stream is 64 events: per event.
      [ "$f" = paced ] && n=$((n * S2_TOKENS))
      got[$f.sys]=$(per "$(kops_get "$OUT/raw/kops-$s-$f.txt" raw_syscalls:sys_enter)" "$n")
      got[$f.sqe]=$(per "$(kops_get "$OUT/raw/kops-$s-$f.txt" io_uring:io_uring_submit_req)" "$n")
    done
    idle_sys="-"; idle_sqe="-"
    if [ "$s" != direct ]; then
      rm -f "$TMP/ready" "$TMP/release"
      taskset -c "$GEN_CPUS" "$LC" hold --addr "127.0.0.1:${PORT[$s]}" --conns 1000 --hold-secs 60 \
        --ready-file "$TMP/ready" --release-file "$TMP/release" --out "$OUT/raw/kops-$s-idle.json" 2>/dev/null &
      cpid=$!; PIDS+=($cpid)
      if wait_file "$TMP/ready" $cpid 60; then
        sleep 1
        kops "$OUT/raw/kops-$s-idle.txt" "${pids[@]}" -- sleep 10
        idle_sys=$(per "$(kops_get "$OUT/raw/kops-$s-idle.txt" raw_syscalls:sys_enter)" 10)
        idle_sqe=$(per "$(kops_get "$OUT/raw/kops-$s-idle.txt" io_uring:io_uring_submit_req)" 10)
      fi
      touch "$TMP/release"; wait $cpid 2>/dev/null || true
    fi
    echo "| $s | ${got[chat.sys]} | ${got[chat.sqe]} | ${got[stream.sys]} | ${got[stream.sqe]} | ${got[paced.sys]} | ${got[paced.sqe]} | $idle_sys | $idle_sqe |" >>"$KO"
    unset got
  done
  log "kernel operations (perf tracepoints; $CONNS connections, ${DUR} s per load; $LAYOUT):"
  cat "$KO"
  exit 0
fi

for r in $(seq 1 "$ROUNDS"); do
  for scen in $SCENARIOS; do
    if [ "$scen" = s4_open ] && [ "$RATE" = auto ]; then
      RATE=$("$LC" rate --runs "$RUNS" --scenario s1_wrk --fraction 0.6) || die "no scenario-1 req/s to derive the open-loop rate from (give --rate)"
      log "open-loop rate (scenario 4): $RATE req/s"
    fi
    log "round $r/$ROUNDS: $scen"
    for s in $SYSTEMS; do "run_$scen" "$r" "$s"; done
  done
done

MEM_SYSTEMS=$(for s in $SYSTEMS; do [ "$s" != direct ] && printf '%s ' "$s"; done; true)
if [ -n "$MEM_SYSTEMS" ]; then
  for r in $(seq 1 "$MEM_ROUNDS"); do
    log "memory round $r/$MEM_ROUNDS: $IDLE_CONNS idle connections, $SLOW_CONNS slow streams ($SLOW_TOKENS tokens, $SLOW_ITL_MS ms apart)"
    # Each measurement starts from a fresh proxy (restarted, then warmed up for a second), so
    # memory kept by an allocator after an earlier scenario does not hide in the baseline.
    for scen in s6_idle s6_slow; do
      for s in $MEM_SYSTEMS; do
        stop_system "$s"; start_system "$s"
        timeout -k 5 30 taskset -c "$GEN_CPUS" wrk -t1 -c"$CONNS" -d1s -s "$OUT/wrk-chat.lua" "$(url "$s")" >/dev/null \
          || fail "warm-up of restarted $s"
        "run_$scen" "$r" "$s"
      done
    done
  done
fi
ELAPSED=$(( $(date +%s) - T_START ))

# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------
ver() { "$@" 2>&1 | head -1 | tr -d '\r' || true; }
META=(
  --meta "date=$(date -u +'%Y-%m-%d %H:%M UTC')"
  --meta "machine=$(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), Linux $(uname -r)"
  --meta "pinning=$LAYOUT"
  --meta "command=loadtest/run.sh $([ "$QUICK" = 1 ] && echo --quick) (rounds $ROUNDS, $DUR s per load, $CONNS connections, $WORKERS worker(s) per proxy, memory rounds $MEM_ROUNDS, bodies of $(wc -c <"$OUT/body-chat.json") bytes, scenarios $SCENARIOS)"
  --meta "scenario 3=$S3_REQS sequential streams per run, first token after $S3_TTFT_MS ms, $S3_TOKENS tokens $S3_ITL_MS ms apart"
  --meta "scenario 4=$RATE req/s open loop, $OPEN_CONNS connections, oha ${OHA_LC[*]:-(no latency correction)}"
  --meta "scenario 6=$IDLE_CONNS idle keep-alive connections; $SLOW_CONNS slow streams of $SLOW_TOKENS tokens $SLOW_ITL_MS ms apart"
  --meta "versions=$(ver nginx -v); $(ver haproxy -v); $(ver wrk -v)$([ "$NEED_OHA" = 0 ] || echo "; $(ver "$OHA" --version)")"
  --meta "elapsed=${ELAPSED} s"
)
echo
"$LC" report --runs "$RUNS" --md "$OUT/report.md" --json "$OUT/report.json" "${META[@]}"
cp "$OUT/report.md" "$ROOT/loadtest/results/latest.md"
cp "$OUT/report.json" "$ROOT/loadtest/results/latest.json"
echo
log "results: $OUT/report.md, report.json, runs.jsonl, raw/ (also loadtest/results/latest.{md,json})"
log "pinning: $LAYOUT"
if [ "$FAILURES" -gt 0 ]; then
  die "$FAILURES run(s) failed (see the FAILED lines above); the table covers the others"
fi
