# Sourced by the side-by-side scripts (access_log_cost.sh, cpu_split.sh, ...): three mock
# engines on 127.0.0.1:19001-19003, pinned to CPU 0, a one-worker Rolter config in front of
# them, and a one-thread HAProxy config to set beside it.
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

# haproxy_config FILE PORT ENGINE_PORT...: HAProxy with one thread on PORT, keep-alive and
# connection reuse to the engines on 127.0.0.1:ENGINE_PORT..., round robin over them.
haproxy_config() {
  local file=$1 port=$2 n=0 p
  shift 2
  { cat <<T
global
  nbthread 1
  maxconn 5000
defaults
  mode http
  option http-keep-alive
  option http-no-delay
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
frontend fe
  bind 127.0.0.1:$port
  default_backend be
backend be
  balance roundrobin
T
    for p in "$@"; do n=$((n + 1)); echo "  server mock$n 127.0.0.1:$p"; done
  } >"$file"
}
