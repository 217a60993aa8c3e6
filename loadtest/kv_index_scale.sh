#!/usr/bin/env bash
# The KV-event index at fleet scale: what `precise_cache_aware`'s index costs the gateway
# per million blocks. 64 mock engines (`rolter-mock`, one thread each, a prefix cache and
# vLLM's KV events over ZMQ) on CPU 0; one Rolter gateway (one worker, access log off) on
# CPU 1 subscribing to all 64 publishers for a `precise_cache_aware` route. A Python
# loader on CPU 0 sends distinct prompts straight to the engines, round robin, open loop,
# so each engine stores new blocks and publishes them (BlockStored, 16 tokens a block, 64
# prompt bytes a block in the mock's model); the gateway does nothing but index them.
# Every --step seconds it reads the gateway's `rolter_kv_index_blocks` (summed over the
# targets, from the admin /metrics), its RSS, and the CPU of the process and of its
# `rolter-kv-events` (ZMQ subscriber) and `rolter-kv-index` (the index's only writer)
# threads, from /proc/PID/task/*/schedstat.
#
#   loadtest/kv_index_scale.sh [--quick] [--engines N] [--blocks-per-s B] [--blocks M]
#       [--prompt-kib K] [--step S]
#   default: 64 engines, 20 000 blocks/s (about 310 a second per engine, an engine
#   prefilling 5 000 tokens/s), until 2 million blocks are indexed (under 2 min);
#   --quick: until 600 000 blocks (~40 s).
# Needs the release binaries with the default features (ZMQ): cargo build --release -p
# rolter -p rolter-mock. Results: loadtest/results/kv-index-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ENGINES=64; BLOCKS_PER_S=20000; BLOCKS=2000000; PROMPT_KIB=8; STEP=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) BLOCKS=600000 ;;
    --engines) ENGINES=$2; shift ;;
    --blocks-per-s) BLOCKS_PER_S=$2; shift ;;
    --blocks) BLOCKS=$2; shift ;;
    --prompt-kib) PROMPT_KIB=$2; shift ;;
    --step) STEP=$2; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
  esac
  shift
done
for f in rolter rolter-mock; do
  [ -x "$B/$f" ] || { echo "no $B/$f: cargo build --release -p rolter -p rolter-mock" >&2; exit 2; }
done
OUT=$ROOT/loadtest/results/kv-index-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
TMP=$(mktemp -d)
MOCKS=(); GW=
PORT=19700; ADMIN=19791
# Each engine's cache holds twice its share of the blocks, so nothing is evicted.
CACHE=$((2 * BLOCKS / ENGINES + 1000))

cleanup() {
  [ -n "$GW" ] && kill "$GW" 2>/dev/null || true
  [ ${#MOCKS[@]} -gt 0 ] && kill "${MOCKS[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# The loader: distinct prompts, round robin over the engines, open loop; every STEP
# seconds one JSON line of the gateway's index size, RSS and CPU.
cat >"$TMP/kvload.py" <<'PY'
"""Open-loop distinct chat prompts round robin over mock engines (keep-alive, one
connection per engine); prints the gateway's index size, RSS and CPU as JSON lines."""

import json
import os
import socket
import sys
import time
import urllib.request

ports, rate, prompt, target, step, gw, admin = (
    [int(p) for p in sys.argv[1].split(",")], float(sys.argv[2]), int(sys.argv[3]),
    int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))


def cpu_ns(pid):
    """Run time of every thread of pid, and of its KV-event threads, in nanoseconds."""
    total, kv = 0, {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            ns = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except OSError:
            continue
        total += ns
        if name.startswith("rolter-kv"):
            kv[name] = kv.get(name, 0) + ns
    return total, kv


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def index_blocks():
    """The gateway's indexed blocks, summed over its targets, and how many are live."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    blocks = live = 0
    for line in text.splitlines():
        if line.startswith("rolter_kv_index_blocks{"):
            blocks += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("rolter_kv_events_live{"):
            live += int(float(line.rsplit(" ", 1)[1]))
    return blocks, live


class Engine:
    """One keep-alive connection to one engine, used one request at a time."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def chat(self, content):
        body = ('{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"%s"}]}'
                % content).encode()
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += self.sock.recv(65536)
        self.buf = rest[length:]
        return int(head[9:12])


def main():
    engines = [Engine(p) for p in ports]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    filler = " ".join(words[i % len(words)] for i in range(prompt // 4))[:prompt]
    t0 = time.perf_counter()
    c0, kv0 = cpu_ns(gw)
    r0, (b0, _) = rss_kib(gw), index_blocks()
    print(json.dumps({"t": 0, "blocks": b0, "rss_kib": r0}), flush=True)
    sent = bad = 0
    next_report = t0 + step
    blocks = b0
    while blocks < target:
        now = time.perf_counter()
        due = t0 + sent / rate
        if due > now:
            time.sleep(min(due - now, max(0.0, next_report - now)))
        else:
            # A distinct prompt: its number first, so its every block is new.
            if engines[sent % len(engines)].chat(f"{sent} {filler}") != 200:
                bad += 1
            sent += 1
        if time.perf_counter() >= next_report:
            next_report += step
            c1, kv1 = cpu_ns(gw)
            blocks, live = index_blocks()
            el = time.perf_counter() - t0
            print(json.dumps({"t": round(el, 1), "sent": sent, "non200": bad, "blocks": blocks,
                              "live": live, "rss_kib": rss_kib(gw),
                              "blocks_per_s": round((blocks - b0) / el),
                              "cpu_ms": round((c1 - c0) / 1e6, 1),
                              "kv_threads_ms": {k: round((v - kv0.get(k, 0)) / 1e6, 1) for k, v in kv1.items()}}),
                  flush=True)


main()
PY

# The summary: CPU and memory per million indexed blocks.
cat >"$TMP/kvsum.py" <<'PY'
"""CPU and RSS per million indexed blocks, from kv_index_scale.sh's JSON lines (thread
names as the kernel keeps them: 15 bytes, so `rolter-kv-events` reads `rolter-kv-event`)."""

import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
first, mid, last = rows[0], rows[len(rows) // 2], rows[-1]
m = (last["blocks"] - first["blocks"]) / 1e6
kv = last["kv_threads_ms"]
grown = (last["rss_kib"] - first["rss_kib"]) / 1024 / m
slope = (last["rss_kib"] - mid["rss_kib"]) / 1024 / max(1e-9, (last["blocks"] - mid["blocks"]) / 1e6)
print("| indexed blocks | seconds | blocks/s | live targets | gateway CPU per million blocks"
      " | of it `rolter-kv-events` / `rolter-kv-index` | RSS before → after | RSS per million"
      " blocks (all / second half) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
print(f"| {last['blocks'] - first['blocks']:,} | {last['t']:.0f} | {last['blocks_per_s']:,} | {last['live']} | "
      f"{last['cpu_ms'] / m:,.0f} ms | {kv.get('rolter-kv-event', 0) / m:,.0f} / "
      f"{kv.get('rolter-kv-index', 0) / m:,.0f} ms | {first['rss_kib'] / 1024:.0f} → "
      f"{last['rss_kib'] / 1024:.0f} MiB | {grown:,.0f} / {slope:,.0f} MiB |")
if last.get("non200"):
    print(f"\n{last['non200']} requests to the engines failed.")
PY

# start_mocks: engines e1..eN on 127.0.0.1:19101.., KV events on tcp://127.0.0.1:5601..
start_mocks() {
  local i
  for ((i = 1; i <= ENGINES; i++)); do
    taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:$((19100 + i)) --threads 1 --name "e$i" \
      --model m --tokens 1 --prefix-cache-blocks "$CACHE" --prefill-us-per-token 0 \
      --kv-events-endpoint tcp://127.0.0.1:$((5600 + i)) >/dev/null 2>&1 &
    MOCKS+=($!)
  done
  for ((i = 1; i <= ENGINES; i++)); do wait_listening $((19100 + i)); done
}

# wait_listening PORT: up to 10 s for a listener on 127.0.0.1:PORT.
wait_listening() {
  local _
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1 after 10 s" >&2
  return 1
}

# gateway_config FILE: one worker, access log off, the admin listener, every engine's
# publisher, a precise_cache_aware route (the engine's /tokenize).
gateway_config() {
  local i
  { printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = 1\npin_workers = false\n' $PORT
    printf '[log]\naccess = "off"\n[admin]\nlisten = "127.0.0.1:%s"\n' $ADMIN
    for ((i = 1; i <= ENGINES; i++)); do
      printf '[[targets]]\nname = "e%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((19100 + i))
      printf '[targets.kv_events]\nendpoint = "tcp://127.0.0.1:%s"\n' $((5600 + i))
    done
    printf '[[routes]]\nname = "chat"\ntargets = [%s]\n' \
      "$(for ((i = 1; i <= ENGINES; i++)); do printf '"e%s",' "$i"; done | sed 's/,$//')"
    printf '[routes.strategy]\nname = "precise_cache_aware"\ntokenizer = "engine"\n'; } >"$1"
}

# wait_connected: until the gateway's subscriptions to all publishers are up (30 s).
wait_connected() {
  local _ n
  for _ in $(seq 150); do
    n=$(curl -sf http://127.0.0.1:$ADMIN/metrics | grep -c '^rolter_kv_events_connected{.*} 1$' || true)
    [ "$n" = "$ENGINES" ] && return 0
    sleep 0.2
  done
  echo "the gateway connected to ${n:-0} of $ENGINES publishers" >&2
  return 1
}

start_mocks
gateway_config "$TMP/gateway.toml"
ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config "$TMP/gateway.toml" >"$TMP/gateway.log" 2>&1 &
GW=$!
wait_listening $PORT
wait_connected
PORTS=$(seq -s, 19101 $((19100 + ENGINES)))
RATE=$(python3 -c "print($BLOCKS_PER_S / ($PROMPT_KIB * 1024 // 64))")
{ echo "date: $(date -u +%FT%TZ)  commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo -)"
  echo "rolter: $(date -u -r "$B/rolter" +%FT%TZ) sha256 $(sha256sum "$B/rolter" | cut -c1-12)"
  echo "engines=$ENGINES blocks/s=$BLOCKS_PER_S (prompts of $PROMPT_KIB KiB at $RATE/s) until $BLOCKS blocks," \
    "engine caches of $CACHE blocks"; } | tee "$OUT/setup.txt"
taskset -c 0 python3 "$TMP/kvload.py" "$PORTS" "$RATE" $((PROMPT_KIB * 1024)) "$BLOCKS" "$STEP" \
  "$GW" $ADMIN | tee "$OUT/steps.jsonl"
python3 "$TMP/kvsum.py" "$OUT/steps.jsonl" | tee "$OUT/table.md"
echo "results in $OUT"
