#!/usr/bin/env bash
# Instructions per request of a rolter binary, counted by callgrind: the gateway (one
# worker, epoll: valgrind does not emulate io_uring) in front of one mock engine, proxying
# sequential non-streaming chat completions from oha. The count is taken at two request
# counts and differenced, so start-up and shutdown cancel out:
#
#   per request = (instructions at N2 - instructions at N1) / (N2 - N1)
#
# Unlike CPU time it does not depend on what else the machine is doing, so two builds can
# be compared on a noisy machine (the timer ticks still add a little that depends on run
# time; compare repeated runs).
#
#   loadtest/callgrind.sh [ROLTER_BINARY] [N1] [N2]   # default target/release/rolter 1000 5000
#
# TOP, TARGET and ROUTE add TOML to the configuration (before the target, to the target, to
# the route) and HEADER adds one request header ("name: value"), e.g. a key and a queue:
#   TOP='[[keys]]
#   name = "k"
#   hash = "sha256:…"' TARGET='max_concurrent = 1000' ROUTE='queue_max = 64' \
#   HEADER='authorization: Bearer …' loadtest/callgrind.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/target/release/rolter}
N1=${2:-1000}
N2=${3:-5000}
MOCK=${MOCK:-$ROOT/target/release/rolter-mock}
OHA=${OHA:-$ROOT/loadtest/.tools/bin/oha}
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
[ -x "$OHA" ] || OHA=$(command -v oha) || { echo "callgrind.sh: needs oha (loadtest/run.sh installs it)" >&2; exit 2; }
[ -x "$MOCK" ] || { echo "callgrind.sh: build the mock first: cargo build --release -p rolter-mock" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/gw.toml" <<EOF
[server]
listen = "127.0.0.1:19600"
workers = 1
pin_workers = false
driver = "epoll"

${TOP:-}

[[targets]]
name = "m"
url = "http://127.0.0.1:19601"
models = ["m"]
${TARGET:-}

[[routes]]
name = "r"
targets = ["m"]
strategy = "round_robin"
${ROUTE:-}
EOF
HEADERS=(-H 'content-type: application/json')
[ -n "${HEADER:-}" ] && HEADERS+=(-H "$HEADER")
echo '{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}' > "$WORK/body.json"

# Total instructions of one run of `n` requests.
count() {
  local n=$1
  "$MOCK" --listen 127.0.0.1:19601 --model m >/dev/null 2>&1 &
  local mock=$!
  sleep 0.5
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" "$BIN" run --config "$WORK/gw.toml" >"$WORK/gw.log" 2>&1 &
  local gw=$!
  for _ in $(seq 1 150); do curl -s -o /dev/null http://127.0.0.1:19600/health && break; sleep 0.2; done
  "$OHA" -n "$n" -c 1 -m POST "${HEADERS[@]}" -D "$WORK/body.json" --no-tui \
    http://127.0.0.1:19600/v1/chat/completions >"$WORK/oha.txt" 2>&1
  grep -q 'Success rate:.*100.00%' "$WORK/oha.txt" || { echo "callgrind.sh: requests failed" >&2; cat "$WORK/oha.txt" >&2; exit 1; }
  kill -INT "$gw"; wait "$gw" || true
  kill "$mock"; wait "$mock" 2>/dev/null || true
  callgrind_annotate "$WORK/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

a=$(count "$N1")
b=$(count "$N2")
echo "$BIN: $(( (b - a) / (N2 - N1) )) instructions per request ($N1 requests: $a, $N2: $b)"
