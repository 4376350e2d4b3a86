#!/usr/bin/env bash
# Userspace service proxy benchmark (not a test): ferry's userspace data path vs HAProxy
# (Debian) configured the same way (one TCP frontend -> one backend, mode tcp), and a direct
# connection as the ceiling, in the same run. Loopback only, bounded.
#
#   bench/proxy/run.sh [SECONDS=5] [CONNS=8]
#
# Both proxies are pinned to one core (PROXY_CPU, default 1; HAProxy with nbthread 1, ferry's
# runtime sizes itself from the affinity mask), the backend and the load generators to the
# other (CLIENT_CPU, default 0). Phases, each alternated ferry/HAProxy ROUNDS times (default 2;
# the figures are the medians):
#   stream  CONNS parallel streams, Gbit/s (proxy_bench load)
#   conn    CONNS parallel connect/1-byte/close loops, connections/s (proxy_bench load)
#   wrk     HTTP/1.1 short connections, one request each (`Connection: close`), wrk -c WRK_CONNS
#           (default 64): requests/s, p50/p99 latency, and the proxy process's CPU time per
#           request (user + system from /proc; the least noisy figure on a shared machine)
# As root everything runs in a network namespace made for the run (deleted at the end), whose
# own TCP counters give the TCP segments sent per wrk request on each path (nstat; exact, unlike
# the timings). Two floor relays run in the same rounds (FLOOR=0 leaves them out): `floor-epoll`
# (one thread of raw edge-triggered epoll: accept, connect, copy, close; nothing else) and
# `floor-tokio` (a task per connection, tokio's copy_bidirectional): the least a relay pays
# per connection, to read ferry's and HAProxy's CPU per request against.
# PROXY_QUOTA=P (percent of one CPU, root, cgroup v1): every proxy runs in its own child cgroup
# of /sys/fs/cgroup/cpu with cpu.cfs_quota_us = P% of a 100 ms period (the same for each;
# removed at the end), so that the proxy, not wrk + backend, is the bottleneck and req/s ratios
# show capacity. SKIP_BUILD=1 runs the proxy_bench already built. Installs haproxy and wrk with apt-get when missing (needs root); without HAProxy its column is
# skipped. Prints ratios ferry/HAProxy at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-5}
CONNS=${2:-8}
ROUNDS=${ROUNDS:-2}
WRK_CONNS=${WRK_CONNS:-64}
PROXY_CPU=${PROXY_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
BACK=127.79.0.1:9000
FERRY=127.79.0.2:8080
HAP=127.79.0.3:8080
FLOOR_EPOLL=127.79.0.4:8080
FLOOR_TOKIO=127.79.0.5:8080
FLOOR=${FLOOR:-1}
PROXY_QUOTA=${PROXY_QUOTA:-}
QUOTA_PERIOD_US=${QUOTA_PERIOD_US:-100000}
# shellcheck source=../lib/cpu-quota.sh
. bench/lib/cpu-quota.sh

for tool in haproxy wrk; do
  if ! command -v $tool >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq $tool >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq $tool >/dev/null; }) || true
  fi
done

[ -n "${SKIP_BUILD:-}" ] || cargo build -q --release -p ferry-proxy --example proxy_bench
BIN=target/release/examples/proxy_bench
PIDS=()
CFG=$(mktemp)
NS=""
X=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -z "$NS" ] || ip netns del "$NS" 2>/dev/null || true
  quota_cleanup
  rm -f "$CFG" "$CFG.wrk"
}
trap cleanup EXIT
if [ "$(id -u)" = 0 ] && command -v nstat >/dev/null 2>&1; then
  NS="ferry-proxy-bench-$$"
  ip netns add "$NS" && ip -n "$NS" link set lo up
  # `ip netns exec` execs the command: $! of a background "${X[@]}" is the process itself.
  X=(ip netns exec "$NS")
fi

"${X[@]}" taskset -c "$CLIENT_CPU" "$BIN" backend "$BACK" & PIDS+=($!)
"${X[@]}" taskset -c "$PROXY_CPU" "$BIN" ferry "$FERRY" "$BACK" 2>/dev/null & PIDS+=($!)
declare -A PID=([ferry]=$!)
if [ "$FLOOR" = 1 ]; then
  "${X[@]}" taskset -c "$PROXY_CPU" "$BIN" floor-epoll "$FLOOR_EPOLL" "$BACK" 2>/dev/null & PIDS+=($!)
  PID[floor-epoll]=$!
  "${X[@]}" taskset -c "$PROXY_CPU" "$BIN" floor-tokio "$FLOOR_TOKIO" "$BACK" 2>/dev/null & PIDS+=($!)
  PID[floor-tokio]=$!
fi

HAVE_HAP=0
if command -v haproxy >/dev/null 2>&1; then
  cat >"$CFG" <<CFG
global
    maxconn 4000
    nbthread 1
defaults
    mode tcp
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind $HAP
    default_backend be
backend be
    server s1 $BACK
CFG
  "${X[@]}" taskset -c "$PROXY_CPU" haproxy -f "$CFG" -db >/dev/null 2>&1 & PIDS+=($!)
  PID[haproxy]=$!
  HAVE_HAP=1
fi
sleep 2
for n in "${!PID[@]}"; do
  kill -0 "${PID[$n]}" 2>/dev/null || { echo "$n did not start (address in use?)"; exit 1; }
done
if [ -n "$PROXY_QUOTA" ]; then
  quota_init proxy-bench "$PROXY_QUOTA"
  for n in "${!PID[@]}"; do
    quota_group "$n" "${PID[$n]}"
    quota_set "$n" "$PROXY_QUOTA"
  done
fi

load() { "${X[@]}" taskset -c "$CLIENT_CPU" timeout $((SECS * 3 + 30)) "$BIN" load "$1" "$SECS" "$CONNS" "$2"; }
# CPU time (user + system, clock ticks) of a process; 0 for "direct".
ticks() { if [ -n "${1:-}" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
# TCP segments sent in the namespace since the last call (0 outside one).
segs() { if [ -n "$NS" ]; then "${X[@]}" nstat 2>/dev/null | awk '$1 == "TcpOutSegs" {s = $2} END {print s + 0}'; else echo 0; fi; }
# -> "req/s p50_ms p99_ms errors proxy_cpu_us_per_request tcp_segments_per_request"
wrk_run() {
  local t0 t1 sg
  t0=$(ticks "${2:-}")
  segs >/dev/null
  "${X[@]}" taskset -c "$CLIENT_CPU" wrk -t2 -c"$WRK_CONNS" -d"${SECS}s" --latency -H "Connection: close" "http://$1/" >"$CFG.wrk"
  sg=$(segs)
  t1=$(ticks "${2:-}")
  awk -v ticks=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v segs="$sg" \
    'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
     / 50%/ {p50 = ms($2)} / 99%/ {p99 = ms($2)} /Requests\/sec/ {r = $2} /requests in/ {n = $1}
     /Socket errors/ {e = $4 + $6 + $8 + $10}
     END {printf "%.0f %.2f %.2f %d %.1f %.2f\n", r, p50, p99, e, (n > 0 ? ticks / hz * 1e6 / n : 0), (n > 0 ? segs / n : 0)}' "$CFG.wrk"
}
val() { echo "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
median() { sort -g | awk '{v[n++] = $1} END {if (!n) print 0; else if (n % 2) printf "%.2f", v[(n - 1) / 2]; else printf "%.2f", (v[n / 2 - 1] + v[n / 2]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

targets=(direct:$BACK ferry:$FERRY)
[ $HAVE_HAP = 1 ] && targets+=(haproxy:$HAP)
[ "$FLOOR" = 1 ] && targets+=(floor-epoll:$FLOOR_EPOLL floor-tokio:$FLOOR_TOKIO)
declare -A GB GBC CPS RPS P50 P99 CPU SEG
echo "== $SECS s per phase, $ROUNDS rounds, $CONNS load connections, wrk -c$WRK_CONNS; proxies on CPU $PROXY_CPU${PROXY_QUOTA:+ (CPU quota $PROXY_QUOTA % each)}, backend and load on CPU $CLIENT_CPU"
[ $HAVE_HAP = 1 ] && echo "   $(haproxy -v | head -1)"
for r in $(seq 1 "$ROUNDS"); do
  for t in "${targets[@]}"; do
    name=${t%%:*}; addr=${t#*:}
    # A failed phase shows as zeros (and "failed") instead of ending the run.
    t0=$(ticks "${PID[$name]:-}")
    LS=$(load "$addr" stream) || LS="gbps=0"
    t1=$(ticks "${PID[$name]:-}")
    LC=$(load "$addr" conn) || LC="cps=0 errors=failed"
    L="gbps=$(val "$LS" gbps) cps=$(val "$LC" cps) errors=$(val "$LC" errors)"
    # Stream bytes per proxy CPU-second (GB/s of CPU; the stream figure a loaded machine keeps).
    gbc=$(awk -v g="$(val "$LS" gbps)" -v s="$SECS" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" 'BEGIN { if (t > 0) printf "%.2f", g / 8 * s / (t / hz); else print 0 }')
    L="$L stream-GB/cpu-s=$gbc"
    W=$(wrk_run "$addr" "${PID[$name]:-}") || W="0 0 0 failed 0 0"
    echo "   round $r $name: $L | wrk req/s p50(ms) p99(ms) errors cpu(us/req) tcp-segments/req: $W"
    GB[$name]+="$(val "$L" gbps) "; GBC[$name]+="$gbc "; CPS[$name]+="$(val "$L" cps) "
    read -r rps p50 p99 _ cpu seg <<<"$W"
    RPS[$name]+="$rps "; P50[$name]+="$p50 "; P99[$name]+="$p99 "; CPU[$name]+="$cpu "; SEG[$name]+="$seg "
  done
done

m() { echo "$1" | tr ' ' '\n' | grep -v '^$' | median; }
echo
printf "%-11s %14s %16s %10s %12s %10s %10s %16s %13s\n" path "stream Gbit/s" "stream GB/CPU-s" "conn/s" "wrk req/s" "p50 ms" "p99 ms" "proxy CPU us/req" "TCP segs/req"
for t in "${targets[@]}"; do
  n=${t%%:*}
  printf "%-11s %14s %16s %10s %12s %10s %10s %16s %13s\n" "$n" "$(m "${GB[$n]}")" "$(m "${GBC[$n]}")" "$(m "${CPS[$n]}")" "$(m "${RPS[$n]}")" \
    "$(m "${P50[$n]}")" "$(m "${P99[$n]}")" "$(m "${CPU[$n]}")" "$(m "${SEG[$n]}")"
done
echo "-- ratios (medians) --"
echo "ferry/direct:  stream $(ratio "$(m "${GB[ferry]}")" "$(m "${GB[direct]}")"), conn/s $(ratio "$(m "${CPS[ferry]}")" "$(m "${CPS[direct]}")"), wrk req/s $(ratio "$(m "${RPS[ferry]}")" "$(m "${RPS[direct]}")")"
if [ $HAVE_HAP = 1 ]; then
  echo "ferry/haproxy: stream $(ratio "$(m "${GB[ferry]}")" "$(m "${GB[haproxy]}")") (goal >= 1.2), stream bytes per CPU-s $(ratio "$(m "${GBC[ferry]}")" "$(m "${GBC[haproxy]}")"), conn/s $(ratio "$(m "${CPS[ferry]}")" "$(m "${CPS[haproxy]}")"), wrk req/s $(ratio "$(m "${RPS[ferry]}")" "$(m "${RPS[haproxy]}")") (goal >= 1.2), wrk p99 $(ratio "$(m "${P99[ferry]}")" "$(m "${P99[haproxy]}")") (goal <= 1), CPU per request $(ratio "$(m "${CPU[ferry]}")" "$(m "${CPU[haproxy]}")"), TCP segments per request $(ratio "$(m "${SEG[ferry]}")" "$(m "${SEG[haproxy]}")")"
fi
if [ "$FLOOR" = 1 ]; then
  echo "CPU per request against the floor: ferry/floor-epoll $(ratio "$(m "${CPU[ferry]}")" "$(m "${CPU[floor-epoll]}")"), haproxy/floor-epoll $(ratio "$(m "${CPU[haproxy]:-}")" "$(m "${CPU[floor-epoll]}")"), ferry/floor-tokio $(ratio "$(m "${CPU[ferry]}")" "$(m "${CPU[floor-tokio]}")"); floor-epoll/haproxy req/s $(ratio "$(m "${RPS[floor-epoll]}")" "$(m "${RPS[haproxy]:-}")")"
fi
