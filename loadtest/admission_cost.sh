#!/usr/bin/env bash
# The cost of admission without contention, before and after priority classes, fair
# queueing and deadlines: three gateways pinned to CPU 1, three mock engines and wrk on
# CPU 0, ROUNDS (default 5) interleaved rounds of 5 s of the ~1 KiB chat load (16 tokens at once)
# each, reported as medians and as each round's ratio to the base run beside it:
#   base     the binary of the commit before admission (ROLTER_BASE), the config below
#   now      this tree's binary, the same config
#   classes  this tree's binary, the same config with two classes, the key's priority, a
#            trusted priority header, a tenant header and a deadline header on every request
# Every config has one API key, `max_concurrent` far above the load and a route queue, so
# every request passes the key check, the cap and the queue's uncontended path. CPU per
# request from /proc/PID/stat (every thread of the process).
#   ROLTER_BASE=/path/to/old/rolter loadtest/admission_cost.sh
# Build the base binary with:
#   git worktree add /tmp/base <commit> && (cd /tmp/base && cargo build --release --bin rolter)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
B=${CARGO_TARGET_DIR:-$ROOT/target}/release
BASE=${ROLTER_BASE:?set ROLTER_BASE to the rolter binary to compare against}
KEY=rolter_admission_cost_key_0123456789abcdef
HASH=sha256:$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
TMP=$(mktemp -d); cd "$TMP"
. "$ROOT/loadtest/mock_fleet.sh"
start_mocks
common() {
  cat <<T
[[keys]]
name = "load"
hash = "$HASH"
$1
[[targets]]
name = "mock1"
url = "http://127.0.0.1:19001"
max_concurrent = 10000
[[targets]]
name = "mock2"
url = "http://127.0.0.1:19002"
max_concurrent = 10000
[[targets]]
name = "mock3"
url = "http://127.0.0.1:19003"
max_concurrent = 10000
[[routes]]
name = "all"
targets = ["mock1", "mock2", "mock3"]
strategy = "round_robin"
queue_max = 256
$2
T
}
gw_config() { # FILE PORT KEY_EXTRA ROUTE_EXTRA [HEAD]
  { printf '%s\n' "$5" '[server]' "listen = \"127.0.0.1:$2\"" 'workers = 1' 'pin_workers = false' \
      '[log]' 'access = "off"'; common "$3" "$4"; } >"$1"
}
gw_config base.toml 19611 "" "" ""
gw_config now.toml 19612 "" "" ""
CLASSES='[[classes]]
name = "interactive"
rank = 0
reserve = 0.1
[[classes]]
name = "batch"
rank = 1'
gw_config classes.toml 19613 'priority = "batch"
set_priority = true' 'priority_header = true
tenant_header = "x-tenant"' "$CLASSES"
chat_wrk_script plain.lua false
{ cat plain.lua; echo "wrk.headers[\"Authorization\"] = \"Bearer $KEY\""; } >key.lua
{ cat key.lua; echo 'wrk.headers["x-rolter-priority"] = "interactive"'
  echo 'wrk.headers["x-tenant"] = "team-a"'; echo 'wrk.headers["x-rolter-deadline-ms"] = "30000"'; } >classes.lua
ROLTER_LOG=warn taskset -c 1 "$BASE" run --config base.toml >base.out 2>&1 & P1=$!
ROLTER_LOG=warn taskset -c 1 $B/rolter run --config now.toml >now.out 2>&1 & P2=$!
ROLTER_LOG=warn taskset -c 1 $B/rolter run --config classes.toml >classes.out 2>&1 & P3=$!
for p in 19611 19612 19613; do wait_listening $p; done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
run() { # NAME PORT PID SCRIPT SECONDS
  local c0 c1 out n
  c0=$(cpu $3)
  out=$(taskset -c 0 wrk -t1 -c32 -d"$5"s -s "$4" http://127.0.0.1:$2/v1/chat/completions)
  c1=$(cpu $3)
  n=$(echo "$out" | awk '/requests in/{print $1}')
  if echo "$out" | grep -q "Non-2xx"; then echo "$1: non-2xx answers" >&2; echo "$out" >&2; exit 1; fi
  echo "$1 requests=$n rps=$(echo "$out" | awk '/Requests\/sec/{print $2}') cpu_us_per_req=$(python3 -c "print(round(($c1-$c0)*10000/$n,2))")"
}
run warm-base 19611 $P1 key.lua 1 >/dev/null; run warm-now 19612 $P2 key.lua 1 >/dev/null
run warm-classes 19613 $P3 classes.lua 1 >/dev/null
for r in $(seq "${ROUNDS:-5}"); do
  run "round $r base" 19611 $P1 key.lua 5
  run "round $r now" 19612 $P2 key.lua 5
  run "round $r classes" 19613 $P3 classes.lua 5
done | tee rounds.txt
python3 - rounds.txt <<'P'
import re, sys
cost = {}
for line in open(sys.argv[1]):
    name = line.split()[2]
    cost.setdefault(name, []).append(float(re.search(r"cpu_us_per_req=([\d.]+)", line).group(1)))
mean = {k: sum(v) / len(v) for k, v in cost.items()}
median = {k: sorted(v)[len(v) // 2] for k, v in cost.items()}
for k in ("base", "now", "classes"):
    # Each round's ratio to the base run of the same round (run back to back), then the
    # median over the rounds: the machine's drift between rounds cancels out.
    paired = sorted(a / b for a, b in zip(cost[k], cost["base"]))
    print(f"{k}: median {median[k]:.2f} us/request, mean {mean[k]:.2f}; "
          f"per-round ratio to base: median {paired[len(paired) // 2]:.3f}x "
          f"(range {paired[0]:.3f}-{paired[-1]:.3f})")
P
kill $P1 $P2 $P3; pkill -f "rolter-mock --listen 127.0.0.1:1900" || true
rm -rf "$TMP"
