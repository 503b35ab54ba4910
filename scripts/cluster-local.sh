#!/usr/bin/env bash
# N `gale serve` replicas behind HAProxy on this machine: one endpoint for tests and demos of the
# deployment docs/cluster.md describes.
#
#   scripts/cluster-local.sh start N PORT [--balance prefix|roundrobin] [--hash-bytes B] [--balance-factor F]
#                                         [-- SERVE_ARGS...]
#   scripts/cluster-local.sh restart I PORT     # replica I (1..N): SIGTERM (it drains), then start it again
#   scripts/cluster-local.sh stop PORT
#
# HAProxy listens on 127.0.0.1:PORT; replica i on PORT + i, started as `gale serve -t 1 SERVE_ARGS`
# (GALE: the binary, default build/gale). --balance prefix (the default) routes by a hash of the
# prompt's first B bytes (default 256; a completion's `prompt`, a chat's first message), consistent
# hashing with bounded loads (no replica takes more than F% of the average load in flight, default
# 150), so requests that share a prefix reach the replica that has it cached;
# roundrobin ignores the prompt. Health checks on /health; a replica that is draining (SIGTERM) or
# down gets no new requests, and requests it refuses before answering are retried on another.
# State (config, logs, pids) in ${GALE_CLUSTER_DIR:-/tmp/gale-cluster-PORT}.
set -euo pipefail
cmd="${1:-}"; shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
gale="${GALE:-$root/build/gale}"

wait_health() {  # port, seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "http://127.0.0.1:$1/health" 2>/dev/null; do
    if ((SECONDS > deadline)); then echo "cluster-local: 127.0.0.1:$1 did not become healthy" >&2; return 1; fi
    sleep 0.1
  done
}

start_replica() {  # dir, i, port
  local dir="$1" i="$2" port="$3"
  # shellcheck disable=SC2046
  "$gale" serve --port "$((port + i))" -t 1 $(cat "$dir/serve_args") > "$dir/replica$i.log" 2>&1 &
  echo $! > "$dir/replica$i.pid"
}

case "$cmd" in
  start)
    n="$1"; port="$2"; shift 2
    balance=prefix; hash_bytes=256; factor=150
    while (($#)); do
      case "$1" in
        --balance) balance="$2"; shift 2 ;;
        --hash-bytes) hash_bytes="$2"; shift 2 ;;
        --balance-factor) factor="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "cluster-local: unknown option $1" >&2; exit 2 ;;
      esac
    done
    command -v haproxy >/dev/null || { echo "cluster-local: haproxy is not installed (apt-get install haproxy)" >&2; exit 1; }
    dir="${GALE_CLUSTER_DIR:-/tmp/gale-cluster-$port}"
    mkdir -p "$dir"
    echo "$*" > "$dir/serve_args"
    echo "$n" > "$dir/replicas"
    for ((i = 1; i <= n; ++i)); do start_replica "$dir" "$i" "$port"; done
    if [ "$balance" = prefix ]; then
      # The key: a completion's prompt, else a chat's first message (the system prompt, where
      # agents keep what their requests share), cut to its first B bytes.
      lb="  http-request set-var(txn.key) req.body,json_query('\$.prompt'),bytes(0,$hash_bytes)
  http-request set-var(txn.key) req.body,json_query('\$.messages[0].content'),bytes(0,$hash_bytes) if !{ var(txn.key) -m found }
  balance hash var(txn.key)
  hash-type consistent
  # Bounded loads: no replica takes more than $factor% of the average of the requests in flight.
  hash-balance-factor $factor"
    else
      lb="  balance roundrobin"
    fi
    {
      cat <<CFG
global
  # No maxconn: HAProxy sizes it to the file-descriptor limit it finds.
  pidfile $dir/haproxy.pid
defaults
  mode http
  timeout connect 2s
  timeout client 600s
  timeout server 600s
  timeout queue 60s
  # Requests are buffered whole (up to tune.bufsize), so one a replica refuses before it answers
  # (connection refused, 503 while it drains, closed without a response) is sent to another.
  option http-buffer-request
  retries 3
  retry-on conn-failure empty-response 503
  option redispatch 1
frontend gale
  bind 127.0.0.1:$port
  default_backend replicas
backend replicas
$lb
  option httpchk GET /health
  http-check expect status 200
CFG
      for ((i = 1; i <= n; ++i)); do
        echo "  server replica$i 127.0.0.1:$((port + i)) check inter 200ms fall 1 rise 2"
      done
    } > "$dir/haproxy.cfg"
    for ((i = 1; i <= n; ++i)); do wait_health "$((port + i))" 120; done
    haproxy -f "$dir/haproxy.cfg" -D
    wait_health "$port" 30
    echo "cluster-local: $n replicas on 127.0.0.1:$((port + 1))-$((port + n)) behind 127.0.0.1:$port ($balance)"
    ;;
  restart)
    i="$1"; port="$2"
    dir="${GALE_CLUSTER_DIR:-/tmp/gale-cluster-$port}"
    pid="$(cat "$dir/replica$i.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    start_replica "$dir" "$i" "$port"
    wait_health "$((port + i))" 120
    ;;
  stop)
    port="$1"
    dir="${GALE_CLUSTER_DIR:-/tmp/gale-cluster-$port}"
    [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
    for f in "$dir"/replica*.pid; do
      [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    for f in "$dir"/replica*.pid "$dir/haproxy.pid"; do
      [ -f "$f" ] || continue
      while kill -0 "$(cat "$f")" 2>/dev/null; do sleep 0.05; done
      rm -f "$f"
    done
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
