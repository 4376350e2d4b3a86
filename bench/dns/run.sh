#!/usr/bin/env bash
# DNS benchmark: `ferry dns` (in-process server over a generated index of 10k Services +
# 150k Pods) against Knot DNS serving a zone file with the same records, in the same run.
#
# Both servers are pinned to one core (SERVER_CPU), dnsperf to another (CLIENT_CPU); loopback
# only, high ports. Prints queries/s, p50/p99 latency at a fixed rate, ferry RSS and ratios.
#
# Env: DURATION (s, default 15), LAT_QPS (rate of the latency run, default 20000),
#      SERVER_CPU (default 1), CLIENT_CPU (default 0), FERRY_PORT (15353), KNOT_PORT (15354).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DURATION="${DURATION:-15}"
LAT_QPS="${LAT_QPS:-20000}"
SERVER_CPU="${SERVER_CPU:-1}"
CLIENT_CPU="${CLIENT_CPU:-0}"
FERRY_PORT="${FERRY_PORT:-15353}"
KNOT_PORT="${KNOT_PORT:-15354}"
COREDNS_QPS_PER_VCPU=17000

need=()
command -v dnsperf >/dev/null || need+=(dnsperf)
command -v knotd >/dev/null || need+=(knot)
command -v taskset >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

WORK="$(mktemp -d /tmp/ferry-dns-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building (release)"
(cd "$ROOT" && cargo build --release -q -p ferry-dns --example dns_bench)
BIN="$ROOT/target/release/examples/dns_bench"

echo "== generating zone file and queries"
"$BIN" gen "$WORK"
wc -l "$WORK/cluster.local.zone" "$WORK/queries.txt" | sed 's/^/   /'

mkdir -p "$WORK/knot"
cat >"$WORK/knot/knot.conf" <<EOF
server:
    rundir: "$WORK/knot"
    listen: 127.0.0.1@$KNOT_PORT
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
database:
    storage: "$WORK/knot/db"
log:
  - target: stderr
    any: warning
template:
  - id: default
    storage: "$WORK"
    zonefile-load: whole
    journal-content: none
zone:
  - domain: cluster.local
    file: "cluster.local.zone"
EOF

wait_port() { # proto port
  for _ in $(seq 1 200); do
    if dig +short +time=1 +tries=1 -p "$2" @127.0.0.1 dns-version.cluster.local TXT 2>/dev/null | grep -q 1.1.0; then
      return 0
    fi
    sleep 0.1
  done
  echo "server on port $2 did not come up" >&2
  return 1
}
command -v dig >/dev/null || { echo "installing dnsutils"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsutils; }

echo "== starting servers (pinned to CPU $SERVER_CPU)"
taskset -c "$SERVER_CPU" "$BIN" serve "127.0.0.1:$FERRY_PORT" 1 2>"$WORK/ferry.log" &
FERRY_PID=$!
PIDS+=("$FERRY_PID")
taskset -c "$SERVER_CPU" knotd -c "$WORK/knot/knot.conf" 2>"$WORK/knot.log" &
KNOT_PID=$!
PIDS+=("$KNOT_PID")
wait_port udp "$FERRY_PORT"
wait_port udp "$KNOT_PORT"
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
FERRY_RSS_IDLE=$(rss_kb "$FERRY_PID")
KNOT_RSS_IDLE=$(rss_kb "$KNOT_PID")

# Sanity: same answers from both for a few names.
for q in "svc-1.ns-1.svc.cluster.local A" "_http._tcp.svc-10.ns-10.svc.cluster.local SRV" \
         "10-128-0-7.ns-7.pod.cluster.local A" "nope.ns-1.svc.cluster.local A"; do
  set -- $q
  a=$(dig +short -p "$FERRY_PORT" @127.0.0.1 "$1" "$2" | sort | tr '\n' ' ')
  b=$(dig +short -p "$KNOT_PORT" @127.0.0.1 "$1" "$2" | sort | tr '\n' ' ')
  [ "$a" = "$b" ] && echo "   same answer: $q -> $a" || echo "   DIFFERENT: $q ferry=[$a] knot=[$b]"
done

throughput() { # port -> qps
  taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries.txt" -l "$DURATION" -c 4 -q 500 2>&1 |
    tee "$WORK/perf-$1.txt" | awk '/Queries per second/ {print $4}'
}
latency() { # port -> "p50_us p99_us"
  taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries.txt" -l 5 -Q "$LAT_QPS" -v 2>/dev/null |
    awk '/^> / {print $NF * 1000000}' | sort -n |
    awk '{v[NR]=$1} END {if (NR==0) {print "n/a n/a"; exit} printf "%.0f %.0f\n", v[int(NR*0.5)+1], v[int(NR*0.99)+1]}'
}

echo "== throughput (${DURATION}s each, dnsperf on CPU $CLIENT_CPU)"
FERRY_QPS=$(throughput "$FERRY_PORT")
KNOT_QPS=$(throughput "$KNOT_PORT")
echo "== latency at $LAT_QPS q/s"
read -r FERRY_P50 FERRY_P99 < <(latency "$FERRY_PORT")
read -r KNOT_P50 KNOT_P99 < <(latency "$KNOT_PORT")
FERRY_RSS=$(rss_kb "$FERRY_PID")
KNOT_RSS=$(rss_kb "$KNOT_PID")
grep -h "Queries lost" "$WORK/perf-$FERRY_PORT.txt" "$WORK/perf-$KNOT_PORT.txt" | sed 's/^/   /' || true

calc() { awk "BEGIN {print $1}"; }
echo
printf "%-12s %12s %10s %10s %14s %14s\n" server "qps/core" "p50(us)" "p99(us)" "RSS idle(MB)" "RSS after(MB)"
printf "%-12s %12.0f %10s %10s %14.1f %14.1f\n" "ferry dns" "$FERRY_QPS" "$FERRY_P50" "$FERRY_P99" \
  "$(calc "$FERRY_RSS_IDLE/1024")" "$(calc "$FERRY_RSS/1024")"
printf "%-12s %12.0f %10s %10s %14.1f %14.1f\n" "knot" "$KNOT_QPS" "$KNOT_P50" "$KNOT_P99" \
  "$(calc "$KNOT_RSS_IDLE/1024")" "$(calc "$KNOT_RSS/1024")"
echo
printf "ferry/knot qps ratio:          %.2f (target >= 0.80)\n" "$(calc "$FERRY_QPS/$KNOT_QPS")"
printf "ferry vs CoreDNS ~%d qps/vCPU: %.2fx (target >= 3)\n" "$COREDNS_QPS_PER_VCPU" \
  "$(calc "$FERRY_QPS/$COREDNS_QPS_PER_VCPU")"
