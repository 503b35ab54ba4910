#!/usr/bin/env bash
# Replicas behind HAProxy (scripts/cluster-local.sh): with prefix routing, requests that share a
# prefix find it in their replica's cache far more often than with round robin; and a replica
# restarted (SIGTERM: it drains, refuses new requests, exits; then starts again) under load
# costs no request: the router retries what a replica refused before answering.
# Usage: tests/cluster/cluster_test.sh path/to/gale
set -euo pipefail
gale="$(realpath "$1")"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cluster="$root/scripts/cluster-local.sh"
command -v haproxy >/dev/null || { echo "haproxy is not installed: scripts/install-deps.sh --test installs it"; exit 1; }
port=$((21000 + ($$ % 400) * 10))
work="$(mktemp -d)"
export GALE="$gale" GALE_CLUSTER_DIR="$work/cluster"
trap 'bash "$cluster" stop "$port" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# The prefix cache's hit rate summed over the replicas' /metrics.
hit_rate() {
  local hits=0 queries=0 h q
  for ((i = 1; i <= $1; ++i)); do
    m="$(curl -fsS "http://127.0.0.1:$((port + i))/metrics")"
    h="$(grep '^gale:prefix_cache_hits_total ' <<< "$m" | cut -d' ' -f2)"
    q="$(grep '^gale:prefix_cache_queries_total ' <<< "$m" | cut -d' ' -f2)"
    hits=$((hits + h)); queries=$((queries + q))
  done
  echo "$hits $queries" | awk '{ printf "%.3f", $1 / $2 }'
}
# Fields of loadgen's results.json summary: completed, error_rate and requests (those sent).
summary() {
  node -e 'const s = require(process.argv[1]).summaries[0]; console.log(s.completed, s.error_rate, s.requests)' "$1/results.json"
}
load() {  # out dir, requests, output length, seconds at most (loadgen stops sending after them)
  "$gale" loadgen --url "http://127.0.0.1:$port/v1" --shared-prefix 32:64 --requests "$2" --concurrency 4 \
    --input-len fixed:16 --output-len "fixed:$3" --duration "${4:-600}" --seed 3 --out "$1" > "$1.log" 2>&1
}

fail=0
declare -A rate
for balance in prefix roundrobin; do
  # Four replicas: round robin computes each of the 32 prefixes up to four times, prefix routing once.
  bash "$cluster" start 4 "$port" --balance "$balance" --balance-factor 200 -- --no-warmup > /dev/null
  load "$work/$balance" 192 4
  read -r completed errors _ < <(summary "$work/$balance")
  rate[$balance]="$(hit_rate 4)"
  echo "     $balance: $completed of 192 completed, error rate $errors, prefix-cache hit rate ${rate[$balance]}"
  bash "$cluster" stop "$port"
  [ "$completed" = 192 ] && [ "$errors" = 0 ] || { echo "FAIL $balance: requests failed"; fail=1; }
done
if awk -v p="${rate[prefix]}" -v r="${rate[roundrobin]}" 'BEGIN { exit !(p > r + 0.05) }'; then
  echo "ok   prefix routing finds more of the prompts in the cache than round robin"
else
  echo "FAIL prefix routing's hit rate ${rate[prefix]} is not well above round robin's ${rate[roundrobin]}"; fail=1
fi

# A replica restarted under load: no request fails. The load is bounded by time, not by a count
# (4000 requests took 10 s on one machine and over loadgen's default 60 s limit on a busy 2-core
# one): 40 s of requests, the restart starting 1 s in; every request sent must complete.
bash "$cluster" start 2 "$port" -- --no-warmup > /dev/null
load "$work/restart" 1000000 32 40 &
loader=$!
sleep 1
kill -0 "$loader" 2>/dev/null || { echo "FAIL the load ended before the restart began (make it longer)"; fail=1; }
bash "$cluster" restart 1 "$port"
restarted_during_load=0
kill -0 "$loader" 2>/dev/null && restarted_during_load=1
wait "$loader"
read -r completed errors sent < <(summary "$work/restart")
echo "     restart under load: $completed of $sent completed, error rate $errors (load still running after the restart: $restarted_during_load)"
if [ "$completed" = "$sent" ] && [ "$sent" -ge 100 ] && [ "$errors" = 0 ] && [ "$restarted_during_load" = 1 ]; then
  echo "ok   a replica restarted under load costs no request"
else
  echo "FAIL requests failed while a replica restarted"; tail -5 "$work/restart.log"; fail=1
fi
bash "$cluster" stop "$port"
exit "$fail"
