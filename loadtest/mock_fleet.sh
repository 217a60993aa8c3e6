# Sourced by the side-by-side scripts (access_log_cost.sh, cpu_split.sh): three mock engines
# on 127.0.0.1:19001-19003, pinned to CPU 0, and a one-worker Rolter config in front of them.
# Needs B (the release binaries' directory).

# start_mocks [mock options...]: starts the three engines in the background.
start_mocks() {
  local p
  for p in 19001 19002 19003; do
    taskset -c 0 "$B/rolter-mock" --listen 127.0.0.1:$p --threads 1 "$@" >/dev/null 2>&1 &
  done
  sleep 0.3
}

# rolter_config FILE PORT [ACCESS]: a gateway on PORT, round robin over the three engines,
# its access log to ACCESS (a path, or "off"; without it, the default: stdout).
rolter_config() {
  cat >"$1" <<T
[server]
listen = "127.0.0.1:$2"
workers = 1
pin_workers = false
${3:+[log]
access = \"$3\"}
[[targets]]
name = "mock1"
url = "http://127.0.0.1:19001"
[[targets]]
name = "mock2"
url = "http://127.0.0.1:19002"
[[targets]]
name = "mock3"
url = "http://127.0.0.1:19003"
[[routes]]
name = "all"
targets = ["mock1", "mock2", "mock3"]
strategy = "round_robin"
T
}
