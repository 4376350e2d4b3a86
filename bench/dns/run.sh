#!/usr/bin/env bash
# DNS benchmark: `ferry dns` (in-process server over a generated index of 10k Services +
# 150k Pods) against Knot DNS serving a zone file with the same records, in the same run.
#
# Built for a busy 2-core machine:
# * both servers are pinned to one core (SERVER_CPU), dnsperf to the other (CLIENT_CPU);
# * the servers take turns, round after round (ferry, knot, knot, ferry, ferry, knot...: the
#   order alternates so that a drift in the machine's load favours neither);
# * servers and dnsperf run at the same raised priority (NICE, default -10 as root): on a shared
#   machine, builds at the default priority otherwise take most of both cores and the figures
#   measure them rather than the servers;
# * every run records the CPU time the server used and whether the server and dnsperf got
#   their cores: the share of their ready-to-run time spent waiting in the run queue
#   (/proc/PID/task/*/schedstat). A run in which either waited more than MAX_WAIT of it is
#   "busy" and left out of the medians (unless under half the runs were quiet). How much of
#   the server's core other processes used meanwhile is printed too (they may use what the
#   server leaves idle without delaying it);
# * the figures are medians over the quiet runs, and the ratios are medians of the ratios of
#   the pairs run back to back in the same round (both quiet).
# Throughput is dnsperf's q/s with many queries outstanding, and also the server's capacity:
# queries answered per CPU-second of the server (what one core would serve, saturated).
# Latency is dnsperf's per-query latency at a constant LAT_QPS (not saturation).
#
# Loopback only, high ports. Env:
#   ROUNDS (5), DURATION (s per throughput run, 5), LAT_DURATION (s per latency run, 5),
#   LAT_QPS (20000), SERVER_CPU (1), CLIENT_CPU (0), MAX_WAIT (0.25), NICE (-10 as root, else 0),
#   FERRY_PORT (15353), KNOT_PORT (15354),
#   BEFORE_BIN: another dns_bench binary (e.g. of an older commit) run as a third server,
#   "before", in the same rounds (port FERRY_PORT+2), for before/after ratios from one run.
#   SERVER_QUOTA: a percentage (1-100). On an idle machine dnsperf on its one core is the limit
#   before either server is (Ferry at ~87 % of its core): q/s then measures dnsperf. With
#   SERVER_QUOTA=P every server gets a cgroup-v1 CPU quota of P % of its core during the
#   throughput runs (a child cgroup per server under /sys/fs/cgroup/cpu/ferry-dns-bench.<pid>,
#   cpu.cfs_period_us QUOTA_PERIOD_US (10000), removed at exit; the latency runs are not
#   capped), so the servers are the limit and the q/s ratio is the capacity ratio. Each
#   throughput run then also records the share of CFS periods in which the server was throttled
#   (near 100 %: the quota, not dnsperf, set the rate). Needs root.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ROUNDS="${ROUNDS:-5}"
DURATION="${DURATION:-5}"
LAT_DURATION="${LAT_DURATION:-5}"
LAT_QPS="${LAT_QPS:-20000}"
SERVER_CPU="${SERVER_CPU:-1}"
CLIENT_CPU="${CLIENT_CPU:-0}"
MAX_WAIT="${MAX_WAIT:-0.25}"
if [ "$(id -u)" = 0 ]; then NICE="${NICE:--10}"; else NICE="${NICE:-0}"; fi
FERRY_PORT="${FERRY_PORT:-15353}"
KNOT_PORT="${KNOT_PORT:-15354}"
BEFORE_PORT=$((FERRY_PORT + 2))
BEFORE_BIN="${BEFORE_BIN:-}"
COREDNS_QPS_PER_VCPU=17000

need=()
command -v dnsperf >/dev/null || need+=(dnsperf)
command -v knotd >/dev/null || need+=(knot)
command -v taskset >/dev/null || need+=(util-linux)
command -v dig >/dev/null || need+=(dnsutils)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

WORK="$(mktemp -d /tmp/ferry-dns-bench.XXXXXX)"
PIDS=()
# shellcheck source=../lib/cpu-quota.sh
. "$ROOT/bench/lib/cpu-quota.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  quota_cleanup
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

wait_port() { # port
  for _ in $(seq 1 300); do
    if dig +short +time=1 +tries=1 -p "$1" @127.0.0.1 dns-version.cluster.local TXT 2>/dev/null | grep -q 1.1.0; then
      return 0
    fi
    sleep 0.1
  done
  echo "server on port $1 did not come up" >&2
  return 1
}

echo "== starting servers (pinned to CPU $SERVER_CPU)"
declare -A PID PORT
SERVERS=(ferry knot)
nice -n "$NICE" taskset -c "$SERVER_CPU" "$BIN" serve "127.0.0.1:$FERRY_PORT" 1 2>"$WORK/ferry.log" &
PID[ferry]=$!
PORT[ferry]=$FERRY_PORT
PIDS+=("${PID[ferry]}")
nice -n "$NICE" taskset -c "$SERVER_CPU" knotd -c "$WORK/knot/knot.conf" 2>"$WORK/knot.log" &
PID[knot]=$!
PORT[knot]=$KNOT_PORT
PIDS+=("${PID[knot]}")
if [ -n "$BEFORE_BIN" ]; then
  nice -n "$NICE" taskset -c "$SERVER_CPU" "$BEFORE_BIN" serve "127.0.0.1:$BEFORE_PORT" 1 2>"$WORK/before.log" &
  PID[before]=$!
  PORT[before]=$BEFORE_PORT
  PIDS+=("${PID[before]}")
  SERVERS+=(before)
fi
for s in "${SERVERS[@]}"; do wait_port "${PORT[$s]}"; done
# Knot pins its UDP worker threads to CPUs of its own choosing (worker 0 to CPU 0: the load
# generator's core in the default layout), overriding taskset. Pin every thread of every server
# again, and check: a server on the client's core would skip the cross-core wakeups the other
# pays for.
pinned() { # pid -> the distinct CPU lists of its threads
  cat /proc/"$1"/task/*/status | awk '/Cpus_allowed_list/ {print $2}' | sort -u | tr '\n' ' '
}
for s in "${SERVERS[@]}"; do
  taskset -a -p -c "$SERVER_CPU" "${PID[$s]}" >/dev/null
  echo "   $s threads pinned to CPU: $(pinned "${PID[$s]}")"
done
if [ -n "${SERVER_QUOTA:-}" ]; then
  quota_init dns-bench "$SERVER_QUOTA"
  for s in "${SERVERS[@]}"; do quota_group "$s" "${PID[$s]}"; done
  echo "   SERVER_QUOTA: throughput runs capped at $SERVER_QUOTA % of a core per server (period ${QUOTA_PERIOD_US} us) in $QUOTA_CG/<server>"
fi
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
declare -A RSS_IDLE
for s in "${SERVERS[@]}"; do RSS_IDLE[$s]=$(rss_kb "${PID[$s]}"); done

# Sanity: same answers from every server for a few names.
for q in "svc-1.ns-1.svc.cluster.local A" "_http._tcp.svc-10.ns-10.svc.cluster.local SRV" \
         "10-128-0-7.ns-7.pod.cluster.local A" "nope.ns-1.svc.cluster.local A"; do
  set -- $q
  a=$(dig +short -p "$FERRY_PORT" @127.0.0.1 "$1" "$2" | sort | tr '\n' ' ')
  b=$(dig +short -p "$KNOT_PORT" @127.0.0.1 "$1" "$2" | sort | tr '\n' ' ')
  [ "$a" = "$b" ] && echo "   same answer: $q -> $a" || echo "   DIFFERENT: $q ferry=[$a] knot=[$b]"
done

# CPU accounting (clock ticks). A process: utime+stime of all its threads. A core: the time
# it spent running tasks (user, nice, system; interrupts excluded).
TCK=$(getconf CLK_TCK)
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
core_ticks() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4}' /proc/stat; }
now() { date +%s.%N; }
calc() { awk "BEGIN {print $1}"; }

# Run-queue waits (ns) and run time of all threads of a process, from schedstat: the time its
# threads were ready to run but did not get a core.
proc_sched() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{r += $1; w += $2} END {print r, w}'; }

# One measured run: $1 server, $2 kind (qps|lat); appends a line to $WORK/runs:
# round server kind v1 v2 v3 srv_cpu_s wall_s srv_wait_share cli_wait_share others_server_core
#   throttled_share (SERVER_QUOTA: CFS periods in which the server was throttled, else 0)
#   qps: v1 q/s, v2 queries answered, v3 0;  lat: v1 p50, v2 p99, v3 p99.9 (us)
# A wait share is the part of a process's time ready to run that it spent waiting for its core.
ROUND=0
measure() {
  local s=$1 kind=$2 port=${PORT[$1]} pid=${PID[$1]}
  local p0 s0 t0 p1 s1 t1 out dp r0 w0 r1 w1 cr=0 cw=0 cr0=0 cw0=0 first=1 sched
  local tp0 tt0 tp1 tt1
  if [ -n "${SERVER_QUOTA:-}" ]; then
    if [ "$kind" = qps ]; then quota_set "$s" "$SERVER_QUOTA"; else quota_set "$s" -1; fi
  fi
  read -r tp0 tt0 < <(quota_throttled "$s")
  p0=$(proc_ticks "$pid"); s0=$(core_ticks "$SERVER_CPU"); read -r r0 w0 < <(proc_sched "$pid"); t0=$(now)
  if [ "$kind" = qps ]; then
    nice -n "$NICE" taskset -c "$CLIENT_CPU" \
      dnsperf -s 127.0.0.1 -p "$port" -d "$WORK/queries.txt" -l "$DURATION" -c 4 -q 500 -t 1 \
      >"$WORK/perf.txt" 2>&1 &
  else
    nice -n "$NICE" taskset -c "$CLIENT_CPU" \
      dnsperf -s 127.0.0.1 -p "$port" -d "$WORK/queries.txt" -l "$LAT_DURATION" -Q "$LAT_QPS" -t 1 -v \
      >"$WORK/perf.txt" 2>/dev/null &
  fi
  dp=$!
  # dnsperf's own schedstat, sampled with shell builtins until it exits (nice and taskset exec).
  local st
  while read -r -a st 2>/dev/null <"/proc/$dp/stat" && [ "${st[2]}" != Z ]; do
    if read -r sched 2>/dev/null <"/proc/$dp/schedstat"; then
      set -- $sched
      if ((first)); then cr0=$1; cw0=$2; first=0; fi
      cr=$1; cw=$2
    fi
    sleep 0.1
  done
  wait "$dp" || true
  p1=$(proc_ticks "$pid"); s1=$(core_ticks "$SERVER_CPU"); read -r r1 w1 < <(proc_sched "$pid"); t1=$(now)
  read -r tp1 tt1 < <(quota_throttled "$s")
  if [ "$kind" = qps ]; then
    out=$(awk '/Queries completed/ {done=$3} /Queries per second/ {q=$4} END {print q+0, done+0, 0}' "$WORK/perf.txt")
  else
    # Sorted after the run, so that sorting is not counted as other work on the cores. A lost
    # query counts as the timeout (1 s), the worst latency.
    local lost
    lost=$(awk '/Queries lost:/ {print $3}' "$WORK/perf.txt")
    out=$(awk '/^> / {print $NF * 1000000}' "$WORK/perf.txt" | sort -n |
      awk -v lost="${lost:-0}" '{v[NR]=$1}
        function at(p,  i) {i = int(N*p)+1; return (i <= NR) ? v[i] : 1000000}
        END {N = NR + lost; if (N==0) {print "0 0 0"; exit}
        printf "%.0f %.0f %.0f\n", at(0.5), at(0.99), at(0.999)}')
  fi
  local wall srv others_s srv_wait cli_wait
  wall=$(calc "$t1 - $t0")
  srv=$(calc "($p1 - $p0) / $TCK")
  others_s=$(calc "(($s1 - $s0) / $TCK - $srv) / $wall")
  srv_wait=$(calc "($w1 - $w0) / (($r1 - $r0) + ($w1 - $w0) + 1)")
  cli_wait=$(calc "($cw - $cw0) / (($cr - $cr0) + ($cw - $cw0) + 1)")
  local thr=0
  if ((tp1 > tp0)); then thr=$(calc "($tt1 - $tt0) / ($tp1 - $tp0)"); fi
  printf "%s %s %s %s %.2f %.2f %.3f %.3f %.2f %.2f\n" "$ROUND" "$s" "$kind" "$out" "$srv" "$wall" \
    "$srv_wait" "$cli_wait" "$others_s" "$thr" >>"$WORK/runs"
}

# The order of the servers in round r: rotated every round.
order() {
  local r=$1 n=${#SERVERS[@]} i
  for ((i = 0; i < n; i++)); do
    if ((r % 2)); then echo "${SERVERS[$(((n - 1 - i + r) % n))]}"; else echo "${SERVERS[$(((i + r) % n))]}"; fi
  done
}

: >"$WORK/runs"
echo "== warm-up (one pass over the queries each: fills ferry's answer cache)"
for s in "${SERVERS[@]}"; do
  taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -d "$WORK/queries.txt" -n 1 -c 4 -q 500 >/dev/null 2>&1
done
echo "== $ROUNDS rounds: throughput (${DURATION}s) then latency at $LAT_QPS q/s (${LAT_DURATION}s), servers in turn"
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  for s in $(order "$ROUND"); do measure "$s" qps; done
  for s in $(order "$ROUND"); do measure "$s" lat; done
  awk -v r="$ROUND" '$1 == r' "$WORK/runs" | sed 's/^/   run: /'
done
for s in "${SERVERS[@]}"; do
  p=$(pinned "${PID[$s]}")
  [ "$p" = "$SERVER_CPU " ] || echo "   WARNING: $s threads ended up on CPUs $p"
done
declare -A RSS_AFTER
for s in "${SERVERS[@]}"; do RSS_AFTER[$s]=$(rss_kb "${PID[$s]}"); done

# Summary (awk): medians over quiet runs, paired ratios.
echo
awk -v max="$MAX_WAIT" -v servers="${SERVERS[*]}" -v coredns="$COREDNS_QPS_PER_VCPU" '
function median(arr, n,    i, j, t, tmp) {
  if (n == 0) return 0
  for (i = 1; i <= n; i++) tmp[i] = arr[i]
  for (i = 2; i <= n; i++) { t = tmp[i]; for (j = i - 1; j >= 1 && tmp[j] > t; j--) tmp[j+1] = tmp[j]; tmp[j+1] = t }
  return (n % 2) ? tmp[(n+1)/2] : (tmp[n/2] + tmp[n/2+1]) / 2
}
{
  r = $1; s = $2; k = $3; quiet = (($9 <= max || $12 >= 0.9) && $10 <= max)   # a quota-bound run (SERVER_QUOTA) waits while throttled
  key = s SUBSEP k
  total[key]++
  if (quiet) nq[key]++
  # qps runs: $4 q/s, $5 queries; lat runs: $4 p50, $5 p99, $6 p999, $7 answers
  if (k == "qps") { v1[key, r] = $4; v2[key, r] = ($7 > 0 ? $5 / $7 : 0); cpu[key, r] = $7 / $8 }
  else { v1[key, r] = $5; v2[key, r] = $4; v3[key, r] = $6; cpu[key, r] = $7 / $8 }
  q[key, r] = quiet; rounds[r] = 1
}
END {
  ns = split(servers, S, " ")
  for (i = 1; i <= ns; i++) for (kk = 1; kk <= 2; kk++) {
    k = (kk == 1) ? "qps" : "lat"; key = S[i] SUBSEP k
    # Quiet runs only when at least half the runs were quiet; otherwise every run.
    use_all = (2 * nq[key] < total[key]); n = 0
    for (r in rounds) if ((key, r) in v1 && (use_all || q[key, r])) {
      n++; a[n] = v1[key, r]; b[n] = v2[key, r]; c[n] = v3[key, r]; d[n] = cpu[key, r]
    }
    M1[key] = median(a, n); M2[key] = median(b, n); M3[key] = median(c, n); MC[key] = median(d, n)
    N[key] = n; ALL[key] = use_all
    delete a; delete b; delete c; delete d
  }
  printf "%-8s %10s %14s %9s %9s %9s %9s %8s %s\n", "server", "q/s", "q/s per CPU-s", "srv CPU", "p50 us", "p99 us", "p99.9 us", "srv CPU", "quiet runs (qps, lat)"
  for (i = 1; i <= ns; i++) {
    kq = S[i] SUBSEP "qps"; kl = S[i] SUBSEP "lat"
    printf "%-8s %10.0f %14.0f %8.0f%% %9.0f %9.0f %9.0f %7.0f%% %d/%d, %d/%d%s\n", S[i], M1[kq], M2[kq], 100 * MC[kq], \
      M2[kl], M1[kl], M3[kl], 100 * MC[kl], nq[kq], total[kq], nq[kl], total[kl], \
      (ALL[kq] || ALL[kl]) ? " (under half quiet: all runs used)" : ""
  }
  print ""
  for (i = 1; i <= ns; i++) {
    if (S[i] == "knot") continue
    for (j = 1; j <= ns; j++) {
      if (S[j] == S[i] || (S[i] == "before") || (S[j] == "ferry")) continue
      # paired ratios: same round, both quiet (all pairs when no pair is quiet)
      a1 = S[i] SUBSEP "qps"; b1 = S[j] SUBSEP "qps"; a2 = S[i] SUBSEP "lat"; b2 = S[j] SUBSEP "lat"
      for (pass = 1; pass <= 2; pass++) {
        n1 = n2 = n3 = 0
        for (r in rounds) {
          okq = (pass == 2) || (q[a1, r] && q[b1, r]); okl = (pass == 2) || (q[a2, r] && q[b2, r])
          if (okq && v1[b1, r] > 0) { n1++; x[n1] = v1[a1, r] / v1[b1, r] }
          if (okq && v2[b1, r] > 0) { n2++; y[n2] = v2[a1, r] / v2[b1, r] }
          if (okl && v1[b2, r] > 0) { n3++; z[n3] = v1[a2, r] / v1[b2, r] }
        }
        nr = 0; for (r in rounds) nr++
        if (2 * n1 >= nr && 2 * n3 >= nr) break
      }
      printf "%s/%s (median of %d/%d/%d same-round pairs%s): q/s %.2f, q/s per CPU-s %.2f, p99 %.2f (lower is better)\n", \
        S[i], S[j], n1, n2, n3, (pass == 2) ? ", all runs: under half quiet" : ", quiet runs", median(x, n1), median(y, n2), median(z, n3)
      delete x; delete y; delete z
    }
  }
  kq = "ferry" SUBSEP "qps"
  printf "ferry vs CoreDNS ~%d q/s per vCPU (published): %.1fx by q/s per CPU-s\n", coredns, M2[kq] / coredns
}' "$WORK/runs"
echo
for s in "${SERVERS[@]}"; do
  printf "RSS %-7s idle %.1f MB, after the runs %.1f MB\n" "$s" "$(calc "${RSS_IDLE[$s]}/1024")" "$(calc "${RSS_AFTER[$s]}/1024")"
done
echo "(quiet run: the server and dnsperf each waited for their core at most $MAX_WAIT of their ready time; servers and dnsperf at nice $NICE)"
