# Sourced by the side-by-side scripts (access_log_cost.sh, cpu_split.sh, ...): three mock
# engines on 127.0.0.1:19001-19003, pinned to CPU 0, a one-worker Rolter config in front of
# them, a one-thread HAProxy config to set beside it, the harness's ~1 KiB body as a wrk
# script, and a wait for a listener.
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

# chat_wrk_script FILE STREAM: a wrk script POSTing loadtest/run.sh's ~1 KiB chat
# completion (a system prompt of 29-byte sentences); STREAM true asks for a 64-token stream,
# false for 16 tokens at once.
chat_wrk_script() {
  local n=$((1024 / 29 - 7)) k max=16
  [ "$2" = true ] && max=64
  { echo 'wrk.method = "POST"'
    printf 'wrk.body = [[{"model":"m","stream":%s,"max_tokens":%s,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"Summarise the plot of a long novel in two sentences."}]}]]\n' \
      "$2" "$max" "$(for ((k = 0; k < n; k++)); do printf 'You are a helpful assistant. '; done)"
    echo 'wrk.headers["Content-Type"] = "application/json"'; } >"$1"
}

# wait_listening PORT: waits up to 5 s for a listener on 127.0.0.1:PORT; fails without one.
wait_listening() {
  local _
  for _ in $(seq 50); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1 after 5 s" >&2
  return 1
}
