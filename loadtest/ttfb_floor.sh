#!/usr/bin/env bash
# Where the added time to first byte goes on a two-CPU machine. The load client on CPU 0
# makes sequential streaming requests (scenario 3's: head at once, first token after 2 ms,
# 4 tokens 3 ms apart; 1 KiB bodies) to each system in turn, in interleaved rounds:
#   direct_same   a mock engine on CPU 0, the client's own CPU (the harness's "direct");
#   direct_cross  a mock engine on CPU 1 (two cross-CPU wake-ups per request, no proxy);
#   rolter        Rolter on CPU 1 in front of the CPU-0 engine (default mode);
#   rolter_busy   the same with busy polling (server.busy_poll, 1ms or --busy-poll);
#   nginx, haproxy  the same layout (one worker, keep-alive upstream).
# It prints each round's TTFB p50 and p99.
#   --hops        also records, for each system's run, perf tracepoints on both CPUs
#                 (net:net_dev_xmit, io_uring:io_uring_complete, io_uring_submit_req,
#                 sched:sched_switch) and prints the median of each hop of a request:
#                 client's send -> proxy's upstream send -> engine's head -> proxy's head
#                 -> client running; and, for the io_uring programs (Rolter, the mock),
#                 the time from the request's receive completion to the next send
#                 submission (the program's own work on the request).
#   --background  runs a closed-loop wrk load (one connection, non-streaming requests) at
#                 the same address during each measurement (with --hops: only the
#                 programs' own work, since the two clients' hops interleave).
# Needs the release binaries, nginx and haproxy (or --systems without them), perf for --hops:
#   loadtest/ttfb_floor.sh [--rounds N] [--requests N] [--systems "LIST"] [--hops] [--background]
#                          [--busy-poll DURATION]
#   (default: 3 rounds of 200 requests, all six systems)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
export PATH="$PATH:/usr/sbin:/sbin"
ROUNDS=3; REQS=200; SYSTEMS="direct_same direct_cross rolter rolter_busy nginx haproxy"
HOPS=0; BACKGROUND=0; BUSY_POLL=1ms
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --requests) REQS=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --hops) HOPS=1 ;;
    --background) BACKGROUND=1 ;;
    --busy-poll) BUSY_POLL=$2; shift ;;
    *) echo "ttfb_floor.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(nproc)" -ge 2 ] || { echo "ttfb_floor.sh: needs two CPUs" >&2; exit 2; }
TMP=$(mktemp -d); cd "$TMP"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:19001 --threads 1 --model m >/dev/null 2>&1 &
PIDS+=($!)
taskset -c 1 "$B/rolter-mock" --listen 127.0.0.1:19011 --threads 1 --model m >/dev/null 2>&1 &
PIDS+=($!)
for mode in default busy; do
  port=19700; poll=""
  [ $mode = busy ] && { port=19701; poll="busy_poll = \"$BUSY_POLL\""; }
  cat >"$mode.toml" <<T
[server]
listen = "127.0.0.1:$port"
workers = 1
pin_workers = false
$poll
[log]
access = "off"
[[targets]]
name = "mock1"
url = "http://127.0.0.1:19001"
[[routes]]
name = "all"
targets = ["mock1"]
strategy = "round_robin"
T
done
cat >nginx.conf <<T
master_process off;
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx.log error;
events { worker_connections 1000; }
http {
  access_log off;
  keepalive_timeout 75s;
  upstream mocks { server 127.0.0.1:19001; keepalive 64; }
  server {
    listen 127.0.0.1:19702;
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
T
. "$ROOT/loadtest/mock_fleet.sh"
haproxy_config haproxy.cfg 19703 19001
chat_wrk_script chat.lua false  # for --background
wait_listening 19001; wait_listening 19011

# hops DATA PROXY_COMM: the medians of a request's hops in a --hops recording.
hops() {
  perf script -i "$1" -F comm,cpu,time,event,trace 2>/dev/null | python3 -c '
import re, statistics, sys
proxy = sys.argv[1]
background = sys.argv[2] == "1"
ev = []
opcode = {}  # io_uring request -> the opcode it was last submitted with
for line in sys.stdin:
    m = re.match(r"\s*(.+?)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$", line)
    if not m:
        continue
    comm, _, t, name, rest = m.groups()
    t = float(t) * 1e6
    if name == "net:net_dev_xmit":
        n = int(re.search(r"len=(\d+)", rest).group(1))
        if n > 66:  # data, not a bare ACK
            ev.append((t, "xmit", comm, n))
    elif name == "sched:sched_switch":
        ev.append((t, "run", re.search(r"next_comm=(\S+)", rest).group(1), 0))
    elif name == "io_uring:io_uring_submit_req":
        req = re.search(r"req (0x[0-9a-f]+)", rest).group(1)
        op = re.search(r"opcode (\w+)", rest).group(1)
        opcode[req] = op
        if op.startswith("SEND") or op.startswith("WRITE"):
            ev.append((t, "send", comm, 0))
    elif name == "io_uring:io_uring_complete":
        req = re.search(r"req (0x[0-9a-f]+)", rest).group(1)
        if opcode.get(req, "").startswith(("RECV", "READ")):  # a receive, not a send
            ev.append((t, "cqe", comm, int(re.search(r"result (-?\d+)", rest).group(1))))
def after(i, kind, who, min_len=0):
    while i < len(ev):
        e = ev[i]
        if e[1] == kind and e[2].startswith(who) and e[3] >= min_len:
            return i
        i += 1
    return None
names = ["client send -> proxy upstream send", "-> engine head sent", "-> proxy head sent",
         "-> client running", "request total"]
if not proxy:
    names = ["-", "client send -> engine head sent", "-", "-> client running", "request total"]
hop = {k: [] for k in names}
i = 0
while not background:
    i = after(i, "xmit", "rolter-loadcl", 1000)
    if i is None:
        break
    t0 = ev[i][0]
    j = after(i + 1, "xmit", proxy, 1000) if proxy else i
    k = after(j + 1, "xmit", "rolter-mock") if j is not None else None
    l = after(k + 1, "xmit", proxy) if proxy and k is not None else k
    m = after(l + 1, "run", "rolter-loadcl") if l is not None else None
    if m is None:
        break
    ts = [t0, ev[j][0], ev[k][0], ev[l][0], ev[m][0]]
    if ts[4] - t0 < 2000:  # one request, not a gap between two
        for n, (a, b) in zip(names, zip(ts, ts[1:])):
            hop[n].append(b - a)
        hop["request total"].append(ts[4] - t0)
    i = m
# The own work of each io_uring program on a request: from the completion of a receive of at
# least 1000 bytes (a request; heads and events of answers are smaller) to its next send.
work = {}
last = {}
for t, kind, comm, n in ev:
    who = next((w for w in ("rolter-w", "rolter-mock") if comm.startswith(w)), None)
    if who is None:
        continue
    if kind == "cqe" and n >= 1000:
        last[who] = t
    elif kind == "send" and who in last:
        work.setdefault(who, []).append(t - last.pop(who))
for n, v in hop.items():
    if v and n != "-":
        print(f"    {n:38s} p50 {statistics.median(v):6.1f} us  (n={len(v)})")
for who, v in work.items():
    name = "Rolter" if who == "rolter-w" else "mock engine"
    print(f"    {name}: request received -> next send submitted  p50 {statistics.median(v):6.1f} us")
' "$2" "$BACKGROUND"
}

for r in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do
    pid=""; comm=""
    case $sys in
      direct_same) port=19001 ;;
      direct_cross) port=19011 ;;
      rolter) port=19700; comm=rolter-w
        ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config default.toml >rolter.log 2>&1 & pid=$! ;;
      rolter_busy) port=19701; comm=rolter-w
        ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config busy.toml >rolter.log 2>&1 & pid=$! ;;
      nginx) port=19702; comm=nginx
        taskset -c 1 nginx -c "$TMP/nginx.conf" -p "$TMP" >/dev/null 2>&1 & pid=$! ;;
      haproxy) port=19703; comm=haproxy
        taskset -c 1 haproxy -f haproxy.cfg >/dev/null 2>&1 & pid=$! ;;
      *) echo "ttfb_floor.sh: unknown system $sys" >&2; exit 2 ;;
    esac
    [ -n "$pid" ] && PIDS+=($pid)
    wait_listening $port
    bg=""
    if [ "$BACKGROUND" = 1 ]; then
      taskset -c 0 wrk -t1 -c1 -d600s -s chat.lua "http://127.0.0.1:$port/v1/chat/completions" >/dev/null 2>&1 &
      bg=$!; PIDS+=($bg); sleep 0.5
    fi
    taskset -c 0 "$B/rolter-loadclient" stream --addr 127.0.0.1:$port --requests "$REQS" \
      --warmup 5 --tokens 4 --itl-ms 3 --ttft-ms 2 --out "$sys.json" >/dev/null &
    lc=$!
    if [ "$HOPS" = 1 ]; then
      sleep 0.5
      perf record -q -a -o "$sys.data" -e net:net_dev_xmit -e sched:sched_switch \
        -e io_uring:io_uring_complete -e io_uring:io_uring_submit_req -- sleep 2 2>/dev/null
    fi
    wait $lc
    [ -n "$bg" ] && { kill "$bg"; wait "$bg" 2>/dev/null || true; }
    [ -n "$pid" ] && { kill "$pid"; wait "$pid" 2>/dev/null || true; }
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); t=d['ttfb_us']
print(f\"round $r $sys ttfb p50={t['p50']:.0f} us p99={t['p99']:.0f} us errors={d['errors']}\")" "$sys.json"
    [ "$HOPS" = 1 ] && hops "$sys.data" "$comm"
  done
done
