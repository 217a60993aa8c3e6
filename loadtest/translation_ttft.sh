#!/usr/bin/env bash
# What translating an answer costs its first token: an Anthropic Messages client's
# streaming requests (1 KiB bodies, 4 tokens 3 ms apart, the first after 2 ms) to two
# Rolter gateways on CPU 1, in interleaved rounds, from the load client on CPU 0:
#   passthrough  the route's target serves /v1/messages itself (a mock in `--api any`
#                mode): the bytes pass untouched;
#   translated   the route's target has chat only (`lacks = ["messages"]`, a mock in
#                `--api openai` mode): the request goes as chat, and every chunk of the
#                answer becomes Anthropic's events on its way back.
#   chat         OpenAI chat clients to the translated gateway: the same engine, its own
#                API, passed through.
# Both engines are mocks on CPU 0 with the same timing, so the difference between the
# TTFTs (the client's first text delta) is the translation's: against `passthrough` (the
# same client API, each engine serving it natively) and against `chat` (the same engine).
# It prints each round's TTFT p50 and p99 and the median differences of the p50s.
#   loadtest/translation_ttft.sh [ROUNDS (5)] [REQUESTS (300)]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=${1:-5}; REQS=${2:-300}
[ "$(nproc)" -ge 2 ] || { echo "translation_ttft.sh: needs two CPUs" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:19031 --threads 1 --model m --api any >/dev/null 2>&1 &
PIDS+=($!)
taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:19032 --threads 1 --model m --api openai >/dev/null 2>&1 &
PIDS+=($!)
gw() { # NAME PORT ENGINE_PORT TARGET_EXTRA
  cat >"$1.toml" <<T
[server]
listen = "127.0.0.1:$2"
workers = 1
pin_workers = false
[log]
access = "off"
[[targets]]
name = "engine"
url = "http://127.0.0.1:$3"
$4
[[routes]]
name = "all"
targets = ["engine"]
strategy = "round_robin"
T
  ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config "$1.toml" >"$1.out" 2>&1 &
  PIDS+=($!)
}
gw passthrough 19731 19031 ""
gw translated 19732 19032 'lacks = ["messages"]'
for p in 19031 19032 19731 19732; do wait_listening $p; done
for r in $(seq "$ROUNDS"); do
  for sys in passthrough translated chat; do
    port=19731; messages=--messages
    [ $sys = translated ] && port=19732
    [ $sys = chat ] && { port=19732; messages=""; }
    taskset -c 0 "$B/rolter-loadclient" stream --addr 127.0.0.1:$port $messages \
      --requests "$REQS" --warmup 10 --tokens 4 --itl-ms 3 --ttft-ms 2 --out "$sys.$r.json" >/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); t=d['ttft_us']
assert d['errors'] == 0 and d['requests'] > 0, d
print(f\"round $r $sys ttft p50={t['p50']:.0f} us p99={t['p99']:.0f} us ttfb p50={d['ttfb_us']['p50']:.0f} us requests={d['requests']}\")" "$sys.$r.json"
  done
done
python3 - "$ROUNDS" <<'P'
import json, statistics, sys
rounds = int(sys.argv[1])
p50 = lambda sys, r: json.load(open(f"{sys}.{r}.json"))["ttft_us"]["p50"]
for base in ("passthrough", "chat"):
    d = [p50("translated", r) - p50(base, r) for r in range(1, rounds + 1)]
    print(f"translated - {base}, TTFT p50 per round (us):", " ".join(f"{x:.0f}" for x in d))
    print(f"median difference: {statistics.median(d):.0f} us")
P
