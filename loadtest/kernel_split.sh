#!/usr/bin/env bash
# Where a proxy's CPU goes, by layer: perf record (cpu-clock, call graphs) of Rolter pinned
# to CPU 1 under a scenario-1 (chat) or scenario-2 (64-token streams) wrk load from CPU 0,
# three mock engines on CPU 0, access log off; then the samples' self time summed by layer:
# the io_uring layer (SQE issue, poll arming, CQE posting, task work), file lookups
# (fget/fput, what registered files would skip), system call entry, the scheduler, the rest
# of the kernel (TCP/IP, sockets, memory), and each user-space object; then the 15 symbols
# with the most self time.
# Needs the release binaries, wrk and perf:
#   loadtest/kernel_split.sh [--load chat|stream] [--secs N]   (default: chat, 8 s)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
LOAD=chat; SECS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --load) LOAD=$2; shift ;;
    --secs) SECS=$2; shift ;;
    *) echo "kernel_split.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case $LOAD in chat) STREAM=false ;; stream) STREAM=true ;; *) echo "--load chat|stream" >&2; exit 2 ;; esac
TMP=$(mktemp -d); cd "$TMP"
trap 'pkill -f "rolter-mock --listen 127.0.0.1:1900" || true; rm -rf "$TMP"' EXIT
. "$ROOT/loadtest/mock_fleet.sh"
chat_wrk_script load.lua $STREAM
start_mocks --model m --tokens 64 --max-running 0
rolter_config rolter.toml 19700 off
ROLTER_LOG=warn taskset -c 1 "$B/rolter" run --config rolter.toml >rolter.log 2>&1 &
pid=$!
wait_listening 19700
taskset -c 0 wrk -t1 -c32 -d$((SECS + 6))s -s load.lua http://127.0.0.1:19700/v1/chat/completions >wrk.txt &
w=$!
sleep 3
perf record -q -e cpu-clock -F 4999 -g -o perf.data -p $pid -- sleep "$SECS" 2>/dev/null
wait $w
kill $pid; wait $pid 2>/dev/null || true
grep -E 'requests in|Requests/sec' wrk.txt
perf report -i perf.data --no-children --sort dso,sym --stdio -g none 2>/dev/null | python3 -c '
import re, sys
layers = [
    ("kernel: io_uring layer (SQE issue, poll arming, CQE posting, task work)",
     r"(__)?io_|io_uring|tctx_task_work|task_work_run"),
    ("kernel: file lookup (fget, fdget, fput)", r"(__)?(fget|fdget|fput)"),
    ("kernel: system call entry and exit", r".*(syscall|entry_SYSCALL|exit_to_user)"),
    ("kernel: scheduler", r"(__)?schedule$|finish_task_switch|pick_next|(en|de)queue_task|try_to_wake_up|ttwu|__switch_to"),
]
total, by = 0.0, {}
for line in sys.stdin:
    m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
    if not m:
        continue
    p, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
    if kind == "k":
        name = next((n for n, rx in layers if re.match(rx, sym)), "kernel: TCP/IP, sockets, memory, the rest")
    else:
        name = "user: " + ("rolter" if "rolter" in dso else dso)
    by[name] = by.get(name, 0.0) + p
    total += p
for name, p in sorted(by.items(), key=lambda x: -x[1]):
    print(f"{p:6.2f} %  {name}")
print(f"{total:6.2f} %  (all samples)")
'
echo "top symbols (self time):"
perf report -i perf.data --no-children --sort dso,sym --stdio -g none 2>/dev/null \
  | grep -E '^ +[0-9]' | head -15
