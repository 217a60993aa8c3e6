#!/usr/bin/env bash
# Prefix-cache routing at fleet scale, side by side: Rolter's `cache_aware` route, SGLang's
# model gateway (`sglang-router`, `--policy cache_aware`) and vllm-router (`--policy
# cache_aware`), each in turn pinned to CPU 1 in front of 16 and 64 mock engines
# (`rolter-mock`, one process and one thread each, on CPU 0 with the load generator).
# One worker thread each: Rolter's `workers = 1`; the other two run one tokio worker (their
# runtime sizes itself to the one CPU it may use; TOKIO_WORKER_THREADS=1 as well). Each
# router keeps its own cache_aware defaults.
#
# The load is a Python generator (written out below, on CPU 0): open loop over 32
# keep-alive connections, non-streaming chat completions of 8 tokens, 1 KiB and 32 KiB
# prompts, two workloads: `multi` (4-turn conversations, each turn the previous prompt
# plus two messages) and `shared` (one of 32 system prompts of 7/8 of the prompt, then a
# distinct question). It records which engine answered each request (the mock's
# `x-mock-engine` header, which all three routers pass back) and reads the router's CPU
# (user+sys of every thread, from /proc/PID/task/*/schedstat, with /proc/PID/stat's
# utime+stime beside it) at the measured window's edges.
#
# Two rates: --low-rate (default 10/s), which all three sustain (vllm-router asks every
# engine to render and tokenize each prompt, so its cost grows with the fleet: at 64
# engines and 32 KiB it needs ~15 ms of CPU a request), and --rate (default 500/s) for the
# systems in --rate-systems (default Rolter and SGLang's gateway). Rounds interleave the
# systems; a round measures each router's CPU with no traffic first, and also runs every
# workload straight at one engine, the baseline for added TTFB. Then each system, alone
# with the largest fleet, takes distinct 1 KiB prompts as fast as the generator sends
# them (vllm-router a twentieth as many), and its RSS is read at each checkpoint.
#
#   loadtest/fleet_routing.sh [--quick] [--rounds N] [--rate R] [--low-rate R]
#       [--seconds S] [--fleets "16 64"] [--systems "rolter sglang vllm"]
#       [--rate-systems "rolter sglang"] [--rss "100000 200000"] [--skip-install]
#   default: 3 rounds of 3 s windows, RSS at 100 k and 200 k prefixes (12-13 min here);
#   --quick: 1 round of 1.5 s windows, RSS at 20 k and 40 k prefixes (2-3 min).
# Needs the release binaries (cargo build --release -p rolter -p rolter-mock), python3 and
# curl; installs sglang-router and vllm-router with pip into loadtest/.tools/routers
# (ROUTERS_VENV names another virtualenv that has both). Results (every run as a JSON
# line, and the tables): loadtest/results/fleet-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
ROUNDS=3; RATE=500; LOW_RATE=10; SECS=3; LOW_SECS=3; WARM=1; IDLE=2; FLEETS="16 64"
SYSTEMS="rolter sglang vllm"; RATE_SYSTEMS="rolter sglang"; RSS_POINTS="100000 200000"
INSTALL=1; PREFIXES=32; VLLM_RSS_SHARE=20
VENV=${ROUTERS_VENV:-$ROOT/loadtest/.tools/routers}
SGLANG_ROUTER=sglang-router==0.3.2; VLLM_ROUTER=vllm-router==0.1.17
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ROUNDS=1; SECS=1.5; LOW_SECS=1.5; WARM=0.5; IDLE=1; RSS_POINTS="20000 40000" ;;
    --rounds) ROUNDS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --low-rate) LOW_RATE=$2; shift ;;
    --seconds) SECS=$2; LOW_SECS=$2; shift ;;
    --rate-systems) RATE_SYSTEMS=$2; shift ;;
    --fleets) FLEETS=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --rss) RSS_POINTS=$2; shift ;;
    --skip-install) INSTALL=0 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
  esac
  shift
done
for f in rolter rolter-mock; do
  [ -x "$B/$f" ] || { echo "no $B/$f: cargo build --release -p rolter -p rolter-mock" >&2; exit 2; }
done
OUT=$ROOT/loadtest/results/fleet-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
TMP=$(mktemp -d)
MOCKS=(); RPID=
PORT=19700
MAXFLEET=$(printf '%s\n' $FLEETS | sort -n | tail -1)

cleanup() {
  [ -n "$RPID" ] && kill -9 "$RPID" 2>/dev/null || true
  [ ${#MOCKS[@]} -gt 0 ] && kill "${MOCKS[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# The load generator and the summary.
cat >"$TMP/fleetgen.py" <<'PY'
"""Chat-completion load for loadtest/fleet_routing.sh: open-loop at a fixed rate (or
closed-loop as fast as the connections go), keep-alive HTTP/1.1 over a few sockets, one
selector loop. It records each answer's `x-mock-engine` header with the request's
prefix key, so hit rates come from where requests landed, and it reads the router's
utime+stime and VmRSS from /proc itself at the measured window's edges.

Workloads (prompt bytes S):
  multi    conversations of 4 turns; turn 1 is one S/2-byte user message, every later
           turn the previous prompt plus an assistant and a user message of S/12 each
           (turn 4 is S bytes); hit = a turn >= 2 served by the engine of the turn before.
  shared   one of K system prompts of 7S/8 bytes, then a distinct S/8-byte user message;
           hit = served by the engine that served most of that system prompt's requests
           in the window (a perfect router scores 1.0).
  distinct every prompt distinct from its first bytes (for memory per prefix).
"""

import argparse
import collections
import json
import os
import random
import selectors
import socket
import sys
import time
import zlib

TURNS = 4
POOL = 1 << 21


def text_pool():
    """A deterministic 2 MiB pool of lowercase words (JSON-safe, no escaping needed)."""
    rnd = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rnd.choice(letters) for _ in range(rnd.randint(2, 9))) for _ in range(4096)]
    out, n = [], 0
    while n < POOL + 64:
        w = words[rnd.randrange(len(words))]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:POOL]


class Text:
    """Slices of the pool: `take(tag, n)` is tag + n-len(tag) pool bytes at a keyed offset."""

    def __init__(self):
        self.pool = text_pool()

    def take(self, tag, n, key):
        n = max(n - len(tag), 0)
        off = (key * 2654435761) % (POOL - n - 1)
        return tag + self.pool[off : off + n]


def body(messages):
    parts = ",".join('{"role":"%s","content":"%s"}' % m for m in messages)
    return ('{"model":"m","max_tokens":8,"stream":false,"messages":[%s]}' % parts).encode()


class Multi:
    """Multi-turn conversations, `active` open at once: a conversation's next turn comes
    `active` requests after its previous one (a quarter of a second at the given rate)."""

    def __init__(self, size, cell, text, active):
        self.size, self.cell, self.text, self.active = size, cell, text, active
        self.seq = 0
        self.convs = {}

    def next(self):
        block, rest = divmod(self.seq, self.active * TURNS)
        turn, c = divmod(rest, self.active)
        conv = block * self.active + c
        self.seq += 1
        msgs = self.convs.get(conv)
        if msgs is None:
            key = zlib.crc32(f"{self.cell}/{conv}".encode())
            msgs = [("user", self.text.take(f"{self.cell} conversation {conv}: ", self.size // 2, key))]
            self.convs[conv] = msgs
        while len(msgs) < 2 * turn + 1:
            k = len(msgs)
            role = "assistant" if k % 2 else "user"
            msgs.append((role, self.text.take(f"turn {k} ", self.size // 12, conv * 31 + k)))
        b = body(msgs[: 2 * turn + 1])
        if turn == TURNS - 1:
            del self.convs[conv]
        return (conv, turn), b


class Shared:
    """K shared system prompts, each request with its own user message."""

    def __init__(self, size, cell, text, k, seed):
        self.size, self.text, self.k = size, text, k
        self.rnd = random.Random(seed)
        self.seq = 0
        sys_n = size * 7 // 8
        self.systems = [text.take(f"{cell} system prompt {i}: ", sys_n, 1000 + i) for i in range(k)]

    def next(self):
        k = self.rnd.randrange(self.k)
        self.seq += 1
        user = self.text.take(f"question {self.seq}: ", self.size // 8, self.seq * 7919)
        return (k, 0), body([("system", self.systems[k]), ("user", user)])


class Distinct:
    """Every prompt distinct from its first bytes."""

    def __init__(self, size, cell, text):
        self.size, self.cell, self.text = size, cell, text
        self.seq = 0

    def next(self):
        self.seq += 1
        return (self.seq, 0), body([("user", self.text.take(f"{self.seq} {self.cell} ", self.size, self.seq))])


def proc_cpu(pid):
    """(utime+stime of pid in seconds, from /proc/PID/stat; the same from the threads'
    schedstat run times, which count nanoseconds instead of clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    ns = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                ns += int(f.read().split()[0])
        except OSError:
            pass
    return ticks, ns / 1e9


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


class Conn:
    __slots__ = ("sock", "out", "buf", "job", "head_end", "length", "chunked", "first", "engine", "status")

    def __init__(self, addr):
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.job = None
        self.buf = bytearray()

    def start(self, job, request):
        self.job, self.out = job, memoryview(request)
        self.buf.clear()
        self.head_end, self.length, self.chunked, self.first = -1, 0, False, 0.0

    def parse_head(self):
        """Parses the response head once it is complete; False while it is not."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buf[:end]).lower()
        self.head_end = end + 4
        self.status = int(head[9:12])
        self.engine = ""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                self.length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"x-mock-engine":
                self.engine = value.strip().decode()
        return True

    def complete(self):
        if self.head_end < 0 and not self.parse_head():
            return False
        if self.chunked:
            return self.buf.endswith(b"0\r\n\r\n")
        return len(self.buf) - self.head_end >= self.length


class Runner:
    """The selector loop: due jobs go to idle connections, answers are recorded."""

    def __init__(self, addr, path, conns):
        self.addr = addr
        self.prefix = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: ").encode()
        self.sel = selectors.DefaultSelector()
        self.idle = [self.connect() for _ in range(conns)]
        self.busy = 0
        self.records = []  # (intended, key, engine, status, ttfb_s)
        self.errors = 0

    def connect(self):
        c = Conn(self.addr)
        self.sel.register(c.sock, selectors.EVENT_READ, c)
        return c

    def send(self, c, job):
        intended, key, b = job
        c.start((intended, key), self.prefix + str(len(b)).encode() + b"\r\n\r\n" + b)
        self.busy += 1
        self.write(c)

    def write(self, c):
        try:
            n = c.sock.send(c.out)
        except BlockingIOError:
            n = 0
        c.out = c.out[n:]
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if len(c.out) else 0)
        self.sel.modify(c.sock, mask, c)

    def read(self, c, now):
        try:
            data = c.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.lost(c)
            return
        if not c.buf:
            c.first = now
        c.buf += data
        if c.job is not None and c.complete():
            intended, key = c.job
            self.records.append((intended, key, c.engine, c.status, c.first - intended))
            c.job = None
            self.busy -= 1
            self.idle.append(c)

    def lost(self, c):
        self.sel.unregister(c.sock)
        c.sock.close()
        if c.job is not None:
            self.errors += 1
            self.busy -= 1
        else:
            self.idle.remove(c)
        self.idle.append(self.connect())

    def poll(self, timeout):
        for k, ev in self.sel.select(timeout):
            c = k.data
            now = time.perf_counter()
            if ev & selectors.EVENT_WRITE and len(c.out):
                self.write(c)
            if ev & selectors.EVENT_READ:
                self.read(c, now)

    def run(self, gen, count, rate, stop_at=None, on_done=None):
        """Sends count jobs (open loop at rate, or closed loop with rate 0) and waits for them."""
        backlog = collections.deque()
        t0 = time.perf_counter()
        sent = 0
        peak = 0
        while sent < count or backlog or self.busy:
            now = time.perf_counter()
            while sent < count and (rate == 0 and len(backlog) < len(self.idle)
                                    or rate and t0 + sent / rate <= now):
                key, b = gen.next()
                backlog.append((t0 + sent / rate if rate else now, key, b))
                sent += 1
            while backlog and self.idle:
                self.send(self.idle.pop(), backlog.popleft())
            peak = max(peak, len(backlog))
            timeout = 0.05
            if rate and sent < count:
                timeout = max(0.0, min(timeout, t0 + sent / rate - time.perf_counter()))
            self.poll(timeout)
            if on_done:
                on_done(len(self.records))
            if stop_at and time.perf_counter() > stop_at:
                break
        return peak


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def hits_multi(recs, window):
    """Turns >= 2 in window served by the engine that served the conversation's previous turn."""
    engine = {key: e for _, key, e, _, _ in recs}
    eligible = [(key, e) for _, key, e, _, _ in window if key[1] > 0 and (key[0], key[1] - 1) in engine]
    good = sum(1 for (conv, turn), e in eligible if e and engine[(conv, turn - 1)] == e)
    return good, len(eligible)


def hits_shared(recs):
    """Requests served by their system prompt's most used engine (per-engine, per-prefix counts)."""
    counts = collections.defaultdict(collections.Counter)
    for _, key, e, _, _ in recs:
        counts[key[0]][e] += 1
    good = sum(c.most_common(1)[0][1] for c in counts.values())
    spread = sum(len(c) for c in counts.values()) / max(1, len(counts))
    return good, sum(sum(c.values()) for c in counts.values()), spread


def cmd_load(a):
    text = Text()
    cell = a.cell
    active = max(4, int(a.rate / 4))
    gen = {"multi": lambda: Multi(a.size, cell, text, active),
           "shared": lambda: Shared(a.size, cell, text, a.prefixes, zlib.crc32(cell.encode()))}[a.workload]()
    r = Runner(("127.0.0.1", a.port), a.path, a.conns)
    r.run(gen, int(a.rate * a.warmup), a.rate)
    warm = len(r.records)
    cpu0 = proc_cpu(a.pid) if a.pid else (0, 0)
    t0 = time.perf_counter()
    peak = r.run(gen, int(a.rate * a.seconds), a.rate, stop_at=t0 + a.seconds * 3 + 10)
    elapsed = time.perf_counter() - t0
    cpu1 = proc_cpu(a.pid) if a.pid else (0, 0)
    win = r.records[warm:]
    ok = [x for x in win if x[3] == 200]
    per_engine = collections.Counter(x[2] for x in ok)
    out = {"mode": "load", "system": a.system, "fleet": a.fleet, "round": a.round,
           "workload": a.workload, "size": a.size,
           "rate": a.rate, "n": len(win), "ok": len(ok), "errors": r.errors,
           "rps": round(len(win) / elapsed, 1), "peak_backlog": peak,
           "ttfb_p50_ms": round(pct([x[4] for x in ok], 0.5) * 1e3, 3) if ok else None,
           "ttfb_p99_ms": round(pct([x[4] for x in ok], 0.99) * 1e3, 3) if ok else None,
           "engines": len(per_engine),
           "top_share": round(max(per_engine.values()) / len(ok), 3) if ok else None}
    if a.pid:
        out["cpu_us"] = round((cpu1[1] - cpu0[1]) * 1e6 / max(1, len(win)), 1)
        out["cpu_us_stat"] = round((cpu1[0] - cpu0[0]) * 1e6 / max(1, len(win)), 1)
        out["threads"] = proc_threads(a.pid)
        out["rss_kib"] = proc_rss_kib(a.pid)
    if a.workload == "multi":
        good, n = hits_multi(r.records, ok)
        out.update(hits=good, eligible=n)
    else:
        good, n, spread = hits_shared(ok)
        out.update(hits=good, eligible=n, engines_per_prefix=round(spread, 2))
    print(json.dumps(out), flush=True)


def cmd_idle(a):
    """The router's CPU with no traffic at all, in ms per second."""
    c0, t0 = proc_cpu(a.pid), time.perf_counter()
    time.sleep(a.seconds)
    c1, t1 = proc_cpu(a.pid), time.perf_counter()
    print(json.dumps({"mode": "idle", "system": a.system, "fleet": a.fleet, "round": a.round,
                      "cpu_ms_per_s": round((c1[1] - c0[1]) * 1e3 / (t1 - t0), 2),
                      "rss_kib": proc_rss_kib(a.pid), "threads": proc_threads(a.pid)}), flush=True)


def cmd_rss(a):
    text = Text()
    gen = Distinct(a.size, a.cell, text)
    r = Runner(("127.0.0.1", a.port), a.path, a.conns)
    points = sorted(a.checkpoints)
    rss = {0: proc_rss_kib(a.pid)}
    t0 = time.perf_counter()

    def on_done(n):
        while points and n >= points[0]:
            rss[points.pop(0)] = proc_rss_kib(a.pid)

    r.run(gen, max(a.checkpoints), 0, on_done=on_done)
    on_done(len(r.records))
    ok = sum(1 for x in r.records if x[3] == 200)
    out = {"mode": "rss", "system": a.system, "fleet": a.fleet, "size": a.size, "n": len(r.records), "ok": ok,
           "errors": r.errors, "seconds": round(time.perf_counter() - t0, 1),
           "rss_kib": {str(k): v for k, v in sorted(rss.items())}, "threads": proc_threads(a.pid)}
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["load", "rss", "idle"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("--pid", type=int, default=0, help="the router's pid (CPU and RSS)")
    p.add_argument("--system", default="")
    p.add_argument("--fleet", type=int, default=0)
    p.add_argument("--round", type=int, default=0)
    p.add_argument("--cell", default="c0", help="text that makes this run's prompts its own")
    p.add_argument("--workload", choices=["multi", "shared"], default="multi")
    p.add_argument("--size", type=int, default=1024, help="prompt bytes")
    p.add_argument("--prefixes", type=int, default=32, help="shared system prompts (K)")
    p.add_argument("--rate", type=float, default=400.0, help="requests/s (open loop)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    p.add_argument("--seconds", type=float, default=5.0, help="the measured window")
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--checkpoints", type=int, nargs="+", default=[100000, 200000])
    a = p.parse_args()
    {"load": cmd_load, "rss": cmd_rss, "idle": cmd_idle}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
PY
cat >"$TMP/summarise.py" <<'PY'
"""Tables for loadtest/fleet_routing.sh from its runs.jsonl: per request rate, CPU per
request, hit rate and added time to first byte, one row per fleet, prompt size and
workload, one column per system (medians over rounds; hits pooled over rounds); then
idle CPU and memory per prefix."""

import collections
import json
import statistics
import sys

NAMES = {"rolter": "Rolter", "sglang": "SGLang gateway", "vllm": "vllm-router"}
PEERS = ("sglang", "vllm")


def load(path):
    cells = collections.defaultdict(list)
    rss, idle = {}, collections.defaultdict(list)
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["mode"] == "rss":
            rss[r["system"]] = r
        elif r["mode"] == "idle":
            idle[(r["system"], r["fleet"])].append(r["cpu_ms_per_s"])
        else:
            cells[(r["system"], r["fleet"], r["size"], r["workload"], r["rate"])].append(r)
    return cells, rss, idle


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def flag(runs):
    """'*' when a run lost requests or did not keep up with the rate (a backlog, or its
    requests took over a ninth longer than the window to be answered)."""
    bad = any(r["errors"] or r["ok"] < r["n"] or r["peak_backlog"] > max(2, r["rate"] * 0.05)
              or r["rps"] < 0.9 * r["rate"] for r in runs)
    return "*" if bad else ""


def kib(size):
    return f"{size // 1024} KiB"


def rows(cells, rate):
    return sorted({(f, s, w) for (x, f, s, w, r) in cells if x != "direct" and r == rate})


def present(cells, rate, order):
    return [x for x in order if any(k[0] == x and k[4] == rate for k in cells)]


def header(systems, extra=()):
    cols = ["engines, prompt, workload"] + [NAMES[s] for s in systems] + list(extra)
    return ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]


def cpu_table(cells, rate, systems):
    peers = [s for s in PEERS if s in systems]
    ratio = "rolter" in systems and peers
    out = header(systems, ["Rolter ÷ better peer"] if ratio else [])
    for f, s, w in rows(cells, rate):
        runs = {x: cells.get((x, f, s, w, rate), []) for x in systems}
        vals = {x: med([r["cpu_us"] for r in runs[x]]) for x in systems}
        row = [f"{vals[x]:.1f} µs{flag(runs[x])}" if vals[x] is not None else "–" for x in systems]
        if ratio:
            best = min((vals[p] for p in peers if vals[p]), default=None)
            row.append(f"{vals['rolter'] / best:.2f}" if best and vals["rolter"] else "–")
        out.append(f"| {f}, {kib(s)}, {w} | " + " | ".join(row) + " |")
    return "\n".join(out)


def hit_rate(runs):
    n = sum(r["eligible"] for r in runs)
    return sum(r["hits"] for r in runs) / n if n else None


def hit_table(cells, rate, systems):
    out = header(systems)
    for f, s, w in rows(cells, rate):
        row = []
        for x in systems:
            runs = cells.get((x, f, s, w, rate), [])
            h = hit_rate(runs)
            if h is None:
                row.append("–")
                continue
            used, top = med([r["engines"] for r in runs]), med([r["top_share"] for r in runs])
            row.append(f"{h:.3f} ({used:.0f} engines, top {top:.0%})")
        out.append(f"| {f}, {kib(s)}, {w} | " + " | ".join(row) + " |")
    return "\n".join(out)


def ttfb_table(cells, rate, systems):
    out = header(systems)
    out[0] = out[0].replace(" |", " | direct p50 / p99 |", 1)
    out[1] += "---:|"
    for f, s, w in rows(cells, rate):
        d = cells.get(("direct", 0, s, w, rate), [])
        d50, d99 = med([r["ttfb_p50_ms"] for r in d]), med([r["ttfb_p99_ms"] for r in d])
        row = [f"{d50:.2f} / {d99:.2f} ms" if d50 is not None else "–"]
        for x in systems:
            runs = cells.get((x, f, s, w, rate), [])
            p50, p99 = med([r["ttfb_p50_ms"] for r in runs]), med([r["ttfb_p99_ms"] for r in runs])
            row.append(f"{p50 - d50:+.2f} / {p99 - d99:+.2f} ms" if p50 is not None and d50 is not None else "–")
        out.append(f"| {f}, {kib(s)}, {w} | " + " | ".join(row) + " |")
    return "\n".join(out)


def idle_table(idle, order):
    fleets = sorted({f for (_, f) in idle})
    systems = [x for x in order if any(k[0] == x for k in idle)]
    out = ["| system | " + " | ".join(f"{f} engines" for f in fleets) + " |", "|---|" + "---:|" * len(fleets)]
    for x in systems:
        vals = [med(idle.get((x, f), [])) for f in fleets]
        out.append(f"| {NAMES[x]} | " + " | ".join(f"{v:.2f} ms/s" if v is not None else "–" for v in vals) + " |")
    return "\n".join(out)


def rss_table(rss, order):
    systems = [s for s in order if s in rss]
    out = ["| system | RSS before | RSS at the two checkpoints | MiB per million prefixes (slope) | inserted at |",
           "|---|---:|---:|---:|---:|"]
    for x in systems:
        r = rss[x]
        kb = {int(k): v for k, v in r["rss_kib"].items()}
        pts = sorted(k for k in kb if k)
        if len(pts) < 2:
            continue
        a, b = pts[-2], pts[-1]
        slope = (kb[b] - kb[a]) / 1024 / ((b - a) / 1e6)
        bad = "*" if r["errors"] or r["ok"] < r["n"] else ""
        out.append(f"| {NAMES[x]}{bad} | {kb[0] / 1024:.0f} MiB | {kb[a] / 1024:.0f} MiB at {a:,}, "
                   f"{kb[b] / 1024:.0f} MiB at {b:,} | {slope:,.0f} | {r['n'] / r['seconds']:,.0f} req/s |")
    return "\n".join(out)


def goal(cells, order):
    """The goal's cells: the largest fleet and prompt, at every rate Rolter ran."""
    lines = []
    fleet = max(k[1] for k in cells)
    size = max(k[2] for k in cells)
    for rate in sorted({k[4] for k in cells if k[0] == "rolter"}):
        systems = present(cells, rate, order)
        for w in ("multi", "shared"):
            runs = {x: cells.get((x, fleet, size, w, rate), []) for x in systems}
            cpu = {x: med([r["cpu_us"] for r in runs[x]]) for x in systems}
            peers = [p for p in PEERS if p in systems and cpu[p]]
            if not peers or not cpu.get("rolter"):
                continue
            best = min(peers, key=lambda p: cpu[p])
            ratio = cpu["rolter"] / cpu[best]
            hits = {x: hit_rate(runs[x]) for x in systems}
            ok = all(hits[p] is None or hits["rolter"] >= hits[p] - 1e-9 for p in peers)
            lines.append(
                f"- {rate:g} req/s, {fleet} engines, {kib(size)}, {w}: Rolter {cpu['rolter']:.1f} µs ÷ "
                f"{NAMES[best]} {cpu[best]:.1f} µs = {ratio:.2f} (≤ 0.33: {'met' if ratio <= 0.33 else 'not met'}); "
                f"hit rate {hits['rolter']:.3f} against "
                + ", ".join(f"{NAMES[p]} {hits[p]:.3f}" for p in peers)
                + f" ({'equal or better' if ok else 'lower'})")
    return "\n".join(lines)


def main():
    cells, rss, idle = load(sys.argv[1])
    order = sys.argv[2].split() if len(sys.argv) > 2 else ["rolter", "sglang", "vllm"]
    for rate in sorted({k[4] for k in cells}, reverse=True):
        systems = present(cells, rate, order)
        if not systems:
            continue
        print(f"## At {rate:g} requests/s (open loop)\n")
        print("CPU per request (router process, user+sys over the window; median of rounds):\n")
        print(cpu_table(cells, rate, systems))
        print("\nHit rate (pooled over rounds); engines that served the window, the busiest one's share:\n")
        print(hit_table(cells, rate, systems))
        print("\nAdded time to first byte, p50 / p99 (medians of rounds, against one engine alone):\n")
        print(ttfb_table(cells, rate, systems) + "\n")
    if idle:
        print("## CPU with no traffic (the router's own timers and checks)\n")
        print(idle_table(idle, order) + "\n")
    if rss:
        print("## Memory after inserting distinct 1 KiB prompts (RSS of the router process)\n")
        print(rss_table(rss, order) + "\n")
    g = goal(cells, order)
    if g:
        print("## The goal (largest fleet and prompt: CPU ≤ 0.33× the better peer, equal or better hit rate)\n")
        print(g + "\n")
    print("`*`: a run that lost requests or fell behind the rate (a backlog over 5 % of a second's"
          " requests, or under 90 % of the rate answered over the window).")


if __name__ == "__main__":
    main()
PY

# install_routers: a virtualenv with both routers (pinned versions), unless it has them.
install_routers() {
  case " $SYSTEMS " in *" sglang "* | *" vllm "*) ;; *) return 0 ;; esac
  if "$VENV/bin/python" -c 'import sglang_router, vllm_router' 2>/dev/null; then return 0; fi
  [ "$INSTALL" = 1 ] || { echo "no routers in $VENV (drop --skip-install)" >&2; exit 2; }
  echo "installing $SGLANG_ROUTER and $VLLM_ROUTER into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "$SGLANG_ROUTER" "$VLLM_ROUTER"
}

# start_mocks N: engines e1..eN on 127.0.0.1:19101.., one thread each, on CPU 0.
start_mocks() {
  local i
  for ((i = 1; i <= $1; i++)); do
    taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:$((19100 + i)) --threads 1 --name "e$i" \
      --model m --tokens 8 >/dev/null 2>&1 &
    MOCKS+=($!)
  done
  for ((i = 1; i <= $1; i++)); do wait_listening $((19100 + i)); done
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

# rolter_config FILE N: one worker, access log off, a cache_aware route over e1..eN
# (the strategy's defaults).
rolter_config() {
  local i
  { printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = 1\npin_workers = false\n' "$PORT"
    printf '[log]\naccess = "off"\n'
    for ((i = 1; i <= $2; i++)); do
      printf '[[targets]]\nname = "e%s"\nurl = "http://127.0.0.1:%s"\n' "$i" $((19100 + i))
    done
    printf '[[routes]]\nname = "chat"\ntargets = [%s]\n' \
      "$(for ((i = 1; i <= $2; i++)); do printf '"e%s",' "$i"; done | sed 's/,$//')"
    printf '[routes.strategy]\nname = "cache_aware"\n'; } >"$1"
}

# all_workers SYSTEM N: whether the router routes to all N engines yet. SGLang's gateway
# serves once its first engine is registered and adds the others in the background
# (about a second for 64); Rolter and vllm-router start with all of them.
all_workers() {
  [ "$1" = sglang ] || return 0
  curl -sf http://127.0.0.1:$PORT/workers | python3 -c 'import json, sys
d = json.load(sys.stdin)
sys.exit(0 if sum(w["is_healthy"] for w in d["workers"]) == int(sys.argv[1]) else 1)' "$2"
}

# start_router SYSTEM N: the system in front of e1..eN on CPU 1; sets RPID once it answers.
start_router() {
  local urls=() i log=$TMP/$1-$2.log
  if (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
    echo "something else listens on 127.0.0.1:$PORT" >&2; exit 1
  fi
  for ((i = 1; i <= $2; i++)); do urls+=("http://127.0.0.1:$((19100 + i))"); done
  case $1 in
    rolter)
      rolter_config "$TMP/rolter-$2.toml" "$2"
      ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config "$TMP/rolter-$2.toml" >"$log" 2>&1 & ;;
    sglang)
      TOKIO_WORKER_THREADS=1 taskset -c 1 "$VENV/bin/python" -m sglang_router.launch_router \
        --worker-urls "${urls[@]}" --policy cache_aware --host 127.0.0.1 --port $PORT \
        --prometheus-host 127.0.0.1 --prometheus-port 19790 --log-level warn >"$log" 2>&1 & ;;
    vllm)
      TOKIO_WORKER_THREADS=1 taskset -c 1 "$VENV/bin/python" -m vllm_router.launch_router \
        --worker-urls "${urls[@]}" --policy cache_aware --host 127.0.0.1 --port $PORT \
        --prometheus-host 127.0.0.1 --prometheus-port 19790 --log-level warning >"$log" 2>&1 & ;;
  esac
  RPID=$!
  for i in $(seq 300); do
    if curl -sf -o /dev/null -H 'content-type: application/json' \
      -d '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"ready?"}]}' \
      http://127.0.0.1:$PORT/v1/chat/completions && kill -0 "$RPID" 2>/dev/null &&
      all_workers "$1" "$2"; then return 0; fi
    kill -0 "$RPID" 2>/dev/null || break
    sleep 0.2
  done
  echo "$1 in front of $2 engines did not answer; its log:" >&2; tail -20 "$log" >&2
  exit 1
}

# stop_router: SIGTERM, then SIGKILL after 10 s; waits until the port is free.
stop_router() {
  local _
  kill "$RPID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$RPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$RPID" 2>/dev/null || true
  wait "$RPID" 2>/dev/null || true
  RPID=
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null || break; sleep 0.1; done
}

# gen ARGS...: the load generator on CPU 0.
gen() { taskset -c 0 python3 "$TMP/fleetgen.py" "$@"; }

# cells SYSTEM FLEET ROUND RATE SECONDS PORT [PID]: the four workloads at RATE against
# PORT, one line each.
cells() {
  local size wl
  for size in 1024 32768; do
    for wl in multi shared; do
      gen load --port "$6" ${7:+--pid "$7"} --system "$1" --fleet "$2" --round "$3" \
        --cell "r$3-$1-$2-$4-$size-$wl" --workload $wl --size $size --rate "$4" \
        --warmup "$WARM" --seconds "$5" --prefixes $PREFIXES | tee -a "$OUT/runs.jsonl"
    done
  done
}

# at_rate SYSTEM: whether SYSTEM also runs at the high rate.
at_rate() { case " $RATE_SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# rounds: every system at every fleet size (idle CPU, the high rate, the low rate), then
# the engine alone at both rates, ROUNDS times.
rounds() {
  local r fleet s
  for r in $(seq 1 "$ROUNDS"); do
    for fleet in $FLEETS; do
      for s in $SYSTEMS; do
        start_router "$s" "$fleet"
        gen idle --pid "$RPID" --system "$s" --fleet "$fleet" --round "$r" --port 0 \
          --seconds "$IDLE" | tee -a "$OUT/runs.jsonl"
        if at_rate "$s"; then cells "$s" "$fleet" "$r" "$RATE" "$SECS" $PORT "$RPID"; fi
        cells "$s" "$fleet" "$r" "$LOW_RATE" "$LOW_SECS" $PORT "$RPID"
        stop_router
      done
    done
    cells direct 0 "$r" "$RATE" "$SECS" 19101
    cells direct 0 "$r" "$LOW_RATE" "$LOW_SECS" 19101
  done
}

# rss: each system alone with the largest fleet takes distinct 1 KiB prompts, as fast as
# it answers; vllm-router (a few hundred a second at most) takes 1/VLLM_RSS_SHARE of them.
rss() {
  local s points p
  for s in $SYSTEMS; do
    points=$RSS_POINTS
    if [ "$s" = vllm ]; then
      points=$(for p in $RSS_POINTS; do echo $((p / VLLM_RSS_SHARE)); done)
    fi
    start_router "$s" "$MAXFLEET"
    gen rss --port $PORT --pid "$RPID" --system "$s" --fleet "$MAXFLEET" --size 1024 \
      --cell "rss-$s" --conns 32 --checkpoints $points | tee -a "$OUT/runs.jsonl"
    stop_router
  done
}

install_routers
start_mocks "$MAXFLEET"
{ echo "date: $(date -u +%FT%TZ)  commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo -)"
  echo "rounds=$ROUNDS rate=$RATE ($RATE_SYSTEMS; ${SECS}s windows) low-rate=$LOW_RATE (${LOW_SECS}s)" \
    "warmup=${WARM}s fleets=\"$FLEETS\" rss=\"$RSS_POINTS\""
  echo "rolter: $(date -u -r "$B/rolter" +%FT%TZ) sha256 $(sha256sum "$B/rolter" | cut -c1-12)"
  echo "routers: $("$VENV/bin/pip" list 2>/dev/null | grep -E '^(sglang-router|vllm-router) ' | tr -s ' ' | paste -sd, -)"
  echo "ci busy at start: $(pgrep -f ci/run >/dev/null && echo yes || echo no)"; } | tee "$OUT/setup.txt"
T0=$SECONDS
rounds
rss
python3 "$TMP/summarise.py" "$OUT/runs.jsonl" "$SYSTEMS" | tee "$OUT/table.md"
echo "took $((SECONDS - T0)) s; results in $OUT"
