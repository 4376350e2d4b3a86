#!/usr/bin/env bash
# API write throughput (issue 18, "API: sequential durable creates"): small objects created
# through a real `ferry apiserver` (release build, plain HTTP on loopback), one keep-alive client
# (sequential) and 8 concurrent clients, side by side with the peers of the same run:
#   * the floor: appends + fdatasync on the same disk (fsync_floor.py), one writer;
#   * etcd (Debian etcd-server) put through its JSON gateway, same clients, same value size;
#   * Ferry on the etcd backend (same etcd), when ETCD_BACKEND=1 (default).
# Every create is durable before it is acknowledged in all three. wrk drives the load (keep-alive,
# `create.lua` / `etcd_put.lua`); the server is pinned to CPU 1 and wrk to CPU 0 (PIN=0 disables).
# Prints requests/s, p50/p99 latency and the ratios Ferry/floor and Ferry/etcd.
#
# Env: FERRY_BIN (default target/release/ferry, built if missing), DURATION (s per run, 8),
#      CLIENTS (8), PORT (17680; PORT+1, PORT+2 for etcd), ETCD_BACKEND (1), KINDS ("configmaps pods"), SKIP_BUILD=1,
#      BEFORE_BIN (another ferry binary, e.g. an older build, measured the same way on redb
#      in the same run: a before/after pair).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/bench/api"
DURATION="${DURATION:-8}"; CLIENTS="${CLIENTS:-8}"; PORT="${PORT:-17680}"
ETCD_BACKEND="${ETCD_BACKEND:-1}"; KINDS="${KINDS:-configmaps pods}"
ETCD_PORT=$((PORT + 1)); ETCD_PEER=$((PORT + 2))
BIN="${FERRY_BIN:-$ROOT/target/release/ferry}"
if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== building (release)"
  (cd "$ROOT" && cargo build --release -q -p ferry --bin ferry)
fi
for t in wrk etcd python3; do command -v "$t" >/dev/null || { echo "missing $t (scripts/test-deps.sh)"; exit 1; }; done

for p in "$PORT" "$ETCD_PORT" "$ETCD_PEER"; do
  if ss -ltn "sport = :$p" | grep -q LISTEN; then echo "port $p is in use: set PORT"; exit 1; fi
done

SRV=(); CLI=()
if [ "${PIN:-1}" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  SRV=(taskset -c 1); CLI=(taskset -c 0)
fi

WORK="$(mktemp -d /tmp/ferry-api-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

RESULTS="$WORK/results"; : >"$RESULTS"
# run_wrk LABEL CONNECTIONS URL SCRIPT: one wrk run; appends "LABEL req/s p50ms p99ms errors".
run_wrk() {
  local label=$1 conns=$2 url=$3 script=$4 threads=1 out
  [ "$conns" -gt 1 ] && threads=2
  out=$(RUN="$RANDOM$RANDOM" "${CLI[@]}" wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency \
        -s "$HERE/$script" "$url" 2>"$WORK/wrk.err")
  local rps p50 p99 bad
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  bad=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); bad=${bad:-0}
  [ -s "$WORK/wrk.err" ] && sed 's/^/   wrk: /' "$WORK/wrk.err" | head -3
  printf "   %-36s %9.0f/s  p50 %-9s p99 %-9s non-2xx %s\n" "$label" "$rps" "$p50" "$p99" "$bad"
  echo "$label $rps $p50 $p99 $bad" >>"$RESULTS"
}
rate() { awk -v l="$1" '$1 == l {print $2}' "$RESULTS"; }
ratio() { awk -v a="$(rate "$1")" -v b="$(rate "$2")" -v n="$3" 'BEGIN {if (b > 0) printf "   %-52s %6.2fx\n", n, a / b}'; }

# The disk is shared and drifts: the floor is measured first and last; the higher one counts.
floor() {
  local rate p50 p99
  read -r _ rate p50 p99 < <("${SRV[@]}" python3 "$HERE/fsync_floor.py" "$WORK" 3000)
  printf "   %-36s %9.0f/s  p50 %-9s p99 %s\n" "fdatasync ($1)" "$rate" "${p50}us" "${p99}us"
  echo "floor-$1 $rate" >>"$RESULTS"
  awk -v r="$rate" '$1 == "floor" {if ($2 > r) r = $2; next} {print} END {print "floor", r}' \
    "$RESULTS" >"$RESULTS.tmp" && mv "$RESULTS.tmp" "$RESULTS"
}
echo "== the floor: write + fdatasync into a zero-filled file on $WORK's disk, one writer"
floor first

echo "== etcd $(etcd --version | awk 'NR==1 {print $3}') (single member, put over the JSON gateway)"
"${SRV[@]}" etcd --name bench --data-dir "$WORK/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "bench=http://127.0.0.1:$ETCD_PEER" --log-level error >"$WORK/etcd.log" 2>&1 &
ETCD=$!; PIDS+=("$ETCD")
until curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null; do
  kill -0 "$ETCD" || { cat "$WORK/etcd.log"; exit 1; }; sleep 0.2
done
run_wrk etcd-put-seq 1 "http://127.0.0.1:$ETCD_PORT" etcd_put.lua
run_wrk etcd-put-c$CLIENTS "$CLIENTS" "http://127.0.0.1:$ETCD_PORT" etcd_put.lua

# bench_ferry TAG ARGS...: starts `ferry apiserver`, creates KINDS sequentially and concurrently.
bench_ferry() {
  local tag=$1; shift
  local data="$WORK/data-$tag" url="http://127.0.0.1:$PORT"
  "${SRV[@]}" "${FERRY:-$BIN}" apiserver --data-dir "$data" --listen-api "127.0.0.1:$PORT" --plain-http "$@" \
    >"$WORK/api-$tag.log" 2>&1 &
  local api=$!; PIDS+=("$api")
  until grep -q "API server ready" "$WORK/api-$tag.log" 2>/dev/null && [ -f "$data/kubeconfig" ]; do
    kill -0 "$api" || { cat "$WORK/api-$tag.log"; exit 1; }; sleep 0.2
  done
  TOKEN=$(awk '/token:/ {print $2; exit}' "$data/kubeconfig"); export TOKEN
  # Pods need their ServiceAccount (admission), which the controllers would create.
  curl -sf -o /dev/null -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default"}}' \
    "$url/api/v1/namespaces/default/serviceaccounts" || true
  for kind in $KINDS; do
    KIND=$kind run_wrk "ferry-$tag-$kind-seq" 1 "$url" create.lua
    KIND=$kind run_wrk "ferry-$tag-$kind-c$CLIENTS" "$CLIENTS" "$url" create.lua
  done
  kill "$api"; wait "$api" 2>/dev/null || true
  [ "$tag" = etcd ] || printf "   %-36s %s\n" "store files after the runs" \
    "$(cd "$data" && du -sh store.redb* 2>/dev/null | tr '\t\n' ' ')"
}

if [ -n "${BEFORE_BIN:-}" ]; then
  echo "== ferry apiserver, redb, before ($BEFORE_BIN)"
  FERRY="$BEFORE_BIN" bench_ferry before
fi
echo "== ferry apiserver, redb ($BIN)"
bench_ferry redb
if [ "$ETCD_BACKEND" = 1 ]; then
  echo "== ferry apiserver, etcd backend (the etcd above)"
  bench_ferry etcd --store etcd --etcd-endpoints "http://127.0.0.1:$ETCD_PORT" --etcd-prefix /ferry-bench
fi

echo "== the floor again"
floor last
echo "== ratios (same run)"
for kind in $KINDS; do
  ratio "ferry-redb-$kind-seq" floor "redb $kind sequential / fdatasync floor"
  ratio "ferry-redb-$kind-seq" etcd-put-seq "redb $kind sequential / etcd put sequential"
  ratio "ferry-redb-$kind-c$CLIENTS" etcd-put-c$CLIENTS "redb $kind $CLIENTS clients / etcd put $CLIENTS clients"
  if [ -n "${BEFORE_BIN:-}" ]; then
    ratio "ferry-redb-$kind-seq" "ferry-before-$kind-seq" "redb $kind sequential / before"
    ratio "ferry-redb-$kind-c$CLIENTS" "ferry-before-$kind-c$CLIENTS" "redb $kind $CLIENTS clients / before"
  fi
  if [ "$ETCD_BACKEND" = 1 ]; then
    ratio "ferry-etcd-$kind-seq" etcd-put-seq "ferry-on-etcd $kind sequential / etcd put sequential"
    ratio "ferry-etcd-$kind-c$CLIENTS" etcd-put-c$CLIENTS "ferry-on-etcd $kind $CLIENTS clients / etcd put"
  fi
done
echo "== goals (issue 18): sequential >= 1500/s, $CLIENTS clients >= 5000/s (redb, configmaps)"
awk -v s="$(rate ferry-redb-configmaps-seq)" -v c="$(rate "ferry-redb-configmaps-c$CLIENTS")" 'BEGIN {
  printf "   sequential %7.0f/s %s\n", s, (s >= 1500 ? "OK" : "MISSED");
  printf "   concurrent %7.0f/s %s\n", c, (c >= 5000 ? "OK" : "MISSED") }'
