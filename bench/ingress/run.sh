#!/usr/bin/env bash
# Ingress proxy benchmark (not a test): HTTP/1.1 keep-alive requests/s and p99 latency through
# Ferry's Ingress data path vs nginx and HAProxy (Debian packages) configured equivalently —
# one frontend, Host/Prefix routing to one backend, keep-alive pooled upstream connections,
# X-Forwarded-For/-Proto/-Host and X-Real-IP set — each proxy pinned to ONE core (taskset),
# in the same run. The origin is `bench_origin` (one epoll loop answering a fixed 100-byte body:
# no per-request work beyond one read and one write), the same for all proxies; wrk and the
# origin share the other core. Each run prints the proxy's CPU time per request and the CPU
# shares of the proxy and of the load side (and the load side's CPU per request) — on two
# cores the load side's 4 loopback socket operations per request cost about what a lean proxy's
# 4 do, so the proxy's CPU time per request is the figure that measures the proxy alone.
# Rounds interleave the proxies; figures are medians over rounds. Loopback only.
# PROXIES="ferry nginx" runs a subset.
#
#   bench/ingress/run.sh [SECONDS=5] [CONNECTIONS=64] [ROUNDS=3]
#   TLS=1 adds the same over HTTPS (ferry-tls, nginx-tls, haproxy-tls).
#   MINI=1 adds bare TCP relays without HTTP work (examples/mini_proxy.rs) to the same rounds:
#   mini-epoll, mini-uring (multishot recv, provided buffers, one io_uring_enter per batch),
#   mini-fixed (io_uring + registered files), mini-tokio — the floor of a proxy's cost per
#   request on each event mechanism.
#
#   PROXY_QUOTA=50 caps every proxy under test to 50 % of its core with a cgroup-v1 CPU quota
#   (PROXY_QUOTA_PERIOD_US, default 10000: cpu.cfs_quota_us = period × 50 %), the same quota for
#   each proxy, in a child cgroup per proxy under /sys/fs/cgroup/cpu/ferry-ingress-bench.<pid>
#   (all the proxy's threads moved there; removed at exit, also on error or interrupt). Without
#   it, wrk + the origin on the other core saturate before a lean proxy does (4 loopback socket
#   operations per request, like the proxy's), so req/s measures the load side. With it the
#   proxy is the bottleneck and the load side has headroom: req/s ratios are capacity ratios
#   (at the quota), and p99 includes the waits of a throttled proxy (at most one period minus
#   the quota, equal for all). Each run then also prints the share of CFS periods in which the
#   proxy was throttled (thr%): near 100 % means the quota, not the load side, set the rate.
#   On a machine shared with other jobs the proxy might not even get its quota, and wrk + the
#   origin might not get their core: so the proxies' cgroups and a cgroup for the load side
#   (origin and each wrk) get a CPU weight of PROXY_QUOTA_SHARES (default 10240, ten nice-0
#   tasks) — the proxy gets its quota and no more, the load side what it needs.
#   Needs root and the cgroup-v1 cpu controller (bench/lib/cpu-quota.sh).
#
# Installs nginx, haproxy and wrk with apt-get when missing (needs root). Prints ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-5}
CONNS=${2:-64}
ROUNDS=${3:-3}
PROXY_CPU=1
LOAD_CPU=0
ORIGIN=127.0.0.1:18080
FERRY=127.0.0.1:18081
NGINX=127.0.0.1:18082
HAP=127.0.0.1:18083
HYPER=127.0.0.1:18084   # Ferry with the fast path off (hyper throughout): the "before"
FERRY_TLS=127.0.0.1:18085
NGINX_TLS=127.0.0.1:18086
HAP_TLS=127.0.0.1:18087
# Measurement aids (MINI=1): bare TCP relays with no HTTP work, epoll vs io_uring
# (examples/mini_proxy.rs): the floor of any proxy's cost per request on each event mechanism.
MINI_EPOLL=127.0.0.1:18088
MINI_URING=127.0.0.1:18089
MINI_FIXED=127.0.0.1:18090
MINI_TOKIO=127.0.0.1:18091

need=()
for t in nginx haproxy wrk; do command -v "$t" >/dev/null 2>&1 || need+=("$t"); done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "need root to install ${need[*]}" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
fi
# Debian's nginx package starts a service on port 80; this bench never uses it.

[ -n "${NO_BUILD:-}" ] || nice -n 19 cargo build -q --release -p ferry-ingress --example ingress_bench --example bench_origin --example mini_proxy
BIN=target/release/examples/ingress_bench
ORIGIN_BIN=target/release/examples/bench_origin
MINI_BIN=target/release/examples/mini_proxy
W=$(mktemp -d)
PIDS=()
QUOTA_PERIOD_US=${PROXY_QUOTA_PERIOD_US:-10000}
# shellcheck source=../lib/cpu-quota.sh
. "$(dirname "$0")/../lib/cpu-quota.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  quota_cleanup
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$W/nginx"
# A certificate for bench.test (ECDSA P-256), served by all three for the HTTPS runs (TLS=1).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
  -keyout "$W/key.pem" -out "$W/crt.pem" >/dev/null 2>&1
cat "$W/crt.pem" "$W/key.pem" >"$W/both.pem"
NGINX_LOCATION=$(cat <<'CFG'
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Real-IP $remote_addr;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_set_header X-Forwarded-Port $server_port;
      proxy_buffering on;
      proxy_next_upstream error timeout;
    }
CFG
)
cat >"$W/nginx/nginx.conf" <<CFG
daemon off;
master_process off;
worker_processes 1;
user root;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream origin { server $ORIGIN; keepalive 256; keepalive_requests 1000000; }
  server {
    listen $NGINX backlog=4096;
    server_name bench.test;
$NGINX_LOCATION
  }
  server {
    listen $NGINX_TLS ssl backlog=4096;
    server_name bench.test;
    ssl_certificate $W/crt.pem;
    ssl_certificate_key $W/key.pem;
$NGINX_LOCATION
  }
}
CFG
cat >"$W/haproxy.cfg" <<CFG
global
    maxconn 8192
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend fe
    bind $HAP
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header X-Forwarded-Port %[dst_port]
    http-request set-header X-Real-IP %[src]
    option forwardfor
    use_backend be if { hdr(host) -m beg bench.test }
    default_backend be
frontend fe_tls
    bind $HAP_TLS ssl crt $W/both.pem
    http-request set-header X-Forwarded-Proto https
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header X-Forwarded-Port %[dst_port]
    http-request set-header X-Real-IP %[src]
    option forwardfor
    use_backend be if { hdr(host) -m beg bench.test }
    default_backend be
backend be
    retry-on conn-failure
    server s1 $ORIGIN
CFG

declare -A PID
taskset -c $LOAD_CPU "$ORIGIN_BIN" "$ORIGIN" 100 & PIDS+=($!); ORIGIN_PID=$!
taskset -c $PROXY_CPU env FERRY_BENCH_TLS="$FERRY_TLS,$W/crt.pem,$W/key.pem" "$BIN" "$FERRY" "$ORIGIN" 0 & PIDS+=($!); PID[ferry]=$!
taskset -c $PROXY_CPU env FERRY_INGRESS_FAST=0 "$BIN" "$HYPER" "$ORIGIN" 0 & PIDS+=($!); PID[hyper]=$!
taskset -c $PROXY_CPU nginx -c "$W/nginx/nginx.conf" & PIDS+=($!); PID[nginx]=$!
taskset -c $PROXY_CPU haproxy -f "$W/haproxy.cfg" -db >/dev/null 2>&1 & PIDS+=($!); PID[haproxy]=$!
if [ -n "${MINI:-}" ]; then
  taskset -c $PROXY_CPU "$MINI_BIN" epoll "$MINI_EPOLL" "$ORIGIN" & PIDS+=($!); PID[mini-epoll]=$!
  taskset -c $PROXY_CPU "$MINI_BIN" uring "$MINI_URING" "$ORIGIN" & PIDS+=($!); PID[mini-uring]=$!
  taskset -c $PROXY_CPU "$MINI_BIN" uring-fixed "$MINI_FIXED" "$ORIGIN" & PIDS+=($!); PID[mini-fixed]=$!
  taskset -c $PROXY_CPU "$MINI_BIN" tokio "$MINI_TOKIO" "$ORIGIN" & PIDS+=($!); PID[mini-tokio]=$!
fi
sleep 2
# PROXY_QUOTA: one child cgroup per proxy, each with the same quota; every thread of the proxy
# moved in (cgroup.procs moves the thread group; the per-thread loop catches any that raced).
if [ -n "${PROXY_QUOTA:-}" ]; then
  QSHARES=${PROXY_QUOTA_SHARES:-10240}
  quota_init ingress-bench "$PROXY_QUOTA"
  quota_group load "$ORIGIN_PID" "$QSHARES"
  for name in "${!PID[@]}"; do
    quota_group "$name" "${PID[$name]}" "$QSHARES"
    quota_set "$name" "$PROXY_QUOTA"
  done
  echo "PROXY_QUOTA: each proxy capped at $PROXY_QUOTA % of a core (period $QUOTA_PERIOD_US us) in $QUOTA_CG/<proxy>; weight $QSHARES for each proxy and for wrk + origin ($QUOTA_CG/load)"
fi
for a in $ORIGIN $FERRY $NGINX $HAP $HYPER ${MINI:+$MINI_EPOLL $MINI_URING $MINI_FIXED $MINI_TOKIO}; do
  curl -sf -H 'Host: bench.test' "http://$a/" >/dev/null || { echo "no answer from $a" >&2; exit 1; }
done
for a in $FERRY_TLS $NGINX_TLS $HAP_TLS; do
  curl -sf --cacert "$W/crt.pem" --resolve "bench.test:${a##*:}:127.0.0.1" "https://bench.test:${a##*:}/" >/dev/null \
    || { echo "no HTTPS answer from $a" >&2; exit 1; }
done

# One wrk run against one proxy: requests/s, p99 (ms), the proxy's CPU time per request (µs,
# perf stat task-clock of the proxy process over the run: the cost that bounds requests/s on
# one core), and the CPU share of the proxy and of the load side (wrk + origin) over the run.
# A proxy share near 100 % (of what the machine's other jobs leave) with the load side below it
# means the proxy was the bottleneck.
# run_load CMD...: CMD in the load side's cgroup (PROXY_QUOTA), else as is.
run_load() { quota_run load "$@"; }
run() {
  local out rps p99 req cpu=0 pshare=0 lshare=0 lcpu=0 thr=- p0=0 t0=0 p1 t1
  read -r p0 t0 < <(quota_throttled "$3")
  perf stat -x, -e task-clock -p "$2" -o "$W/stat" -- sleep $((SECS + 1)) >/dev/null 2>&1 & local sp=$!
  perf stat -x, -e task-clock -p "$ORIGIN_PID" -o "$W/ostat" -- sleep $((SECS + 1)) >/dev/null 2>&1 & local op=$!
  sleep 0.3
  out=$(run_load taskset -c $LOAD_CPU perf stat -x, -e task-clock -o "$W/wstat" -- \
        wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -H 'Host: bench.test' "$1")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  req=$(awk '/requests in/ {print $1}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v=v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v=v*1000}; print v}' <<<"$out")
  wait "$sp" "$op" || true
  if [ -n "$QUOTA_CG" ]; then
    read -r p1 t1 < <(quota_throttled "$3")
    thr=$(awk -v p=$((p1 - p0)) -v t=$((t1 - t0)) 'BEGIN{if (p>0) printf "%.0f", 100*t/p; else print 0}')
  fi
  # task-clock of a -p run covers the sleep ($SECS+1 s, the wrk run inside it); the requests
  # all fall in the wrk run, the idle remainder adds ~nothing.
  cpu=$(awk -F, -v r="$req" '$3 ~ /^task-clock/ {printf "%.2f", $1*1000/r}' "$W/stat")
  pshare=$(awk -F, -v s="$SECS" '$3 ~ /^task-clock/ {printf "%.0f", $1/(s*10)}' "$W/stat")
  lshare=$(cat "$W/ostat" "$W/wstat" | awk -F, -v s="$SECS" '$3 ~ /^task-clock/ {t+=$1} END {printf "%.0f", t/(s*10)}')
  lcpu=$(cat "$W/ostat" "$W/wstat" | awk -F, -v r="$req" '$3 ~ /^task-clock/ {t+=$1} END {printf "%.2f", t*1000/r}')
  echo "$rps $p99 ${cpu:-0} ${pshare:-0} ${lshare:-0} ${lcpu:-0} $thr"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

perf stat -e task-clock -- true >/dev/null 2>&1 || { echo "perf stat does not work here" >&2; exit 1; }
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)  load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
url_of() {
  case $1 in
    ferry) echo "http://$FERRY/";; nginx) echo "http://$NGINX/";; haproxy) echo "http://$HAP/";;
    hyper) echo "http://$HYPER/";; ferry-tls) echo "https://$FERRY_TLS/";;
    nginx-tls) echo "https://$NGINX_TLS/";; haproxy-tls) echo "https://$HAP_TLS/";;
    mini-epoll) echo "http://$MINI_EPOLL/";; mini-uring) echo "http://$MINI_URING/";;
    mini-fixed) echo "http://$MINI_FIXED/";; mini-tokio) echo "http://$MINI_TOKIO/";;
  esac
}
declare -A RPS P99 CPU
# suite TITLE NAME...: interleaved rounds over the named proxies, then medians and ratios
# (the first three names: ferry, nginx, haproxy in that order).
suite() {
  local title=$1; shift
  local names=("$@") name r rps p99 cpu ps ls lc thr
  echo "== $title: wrk -t1 -c$CONNS -d${SECS}s keep-alive, 100-byte bodies, proxies on cpu $PROXY_CPU${PROXY_QUOTA:+ capped at $PROXY_QUOTA %}, wrk + origin on cpu $LOAD_CPU, $ROUNDS rounds =="
  echo "   (proxy% / load%: CPU share of the proxy process / of wrk + origin over the run; then the load side's CPU per request${PROXY_QUOTA:+; thr%: CFS periods in which the proxy was throttled})"
  for name in "${names[@]}"; do RPS[$name]=""; P99[$name]=""; CPU[$name]=""; done
  local pr_rps="" pr_cpu=""
  for r in $(seq 1 "$ROUNDS"); do
    for name in "${names[@]}"; do
      read -r rps p99 cpu ps ls lc thr < <(run "$(url_of "$name")" "${PID[${name%-tls}]}" "${name%-tls}")
      printf '  round %d %-11s %8.0f req/s   p99 %7.2f ms   cpu %6.2f us/req   proxy %3s%%  load %3s%% (%.2f us/req)%s\n' \
        "$r" "$name" "$rps" "$p99" "$cpu" "$ps" "$ls" "$lc" "${QUOTA_CG:+  thr $thr%}"
      RPS[$name]+=" $rps"; P99[$name]+=" $p99"; CPU[$name]+=" $cpu"
    done
    # Same-round ratios (ferry vs the better peer of this round): the machine's load drifts
    # between rounds, the proxies of one round share it.
    if [ ${#names[@]} -ge 3 ]; then
      local rf rn rh cf cn ch
      rf=$(awk '{print $NF}' <<<"${RPS[${names[0]}]}"); rn=$(awk '{print $NF}' <<<"${RPS[${names[1]}]}")
      rh=$(awk '{print $NF}' <<<"${RPS[${names[2]}]}"); cf=$(awk '{print $NF}' <<<"${CPU[${names[0]}]}")
      cn=$(awk '{print $NF}' <<<"${CPU[${names[1]}]}"); ch=$(awk '{print $NF}' <<<"${CPU[${names[2]}]}")
      pr_rps+=" $(awk -v f="$rf" -v n="$rn" -v h="$rh" 'BEGIN{b=(h>n)?h:n; if (b>0) printf "%.3f", f/b}')"
      pr_cpu+=" $(awk -v f="$cf" -v n="$cn" -v h="$ch" 'BEGIN{b=(h<n)?h:n; if (f>0) printf "%.3f", b/f}')"
    fi
  done
  echo "-- medians over $ROUNDS rounds (load average now $(cut -d' ' -f1-3 /proc/loadavg)) --"
  for name in "${names[@]}"; do
    RPS[$name]=$(median <<<"${RPS[$name]}"); P99[$name]=$(median <<<"${P99[$name]}"); CPU[$name]=$(median <<<"${CPU[$name]}")
    printf '  %-11s %8.0f req/s   p99 %7.2f ms   cpu %6.2f us/req = %6.0f req per core-second\n' \
      "$name" "${RPS[$name]}" "${P99[$name]}" "${CPU[$name]}" "$(awk -v c="${CPU[$name]}" 'BEGIN{print 1e6/c}')"
  done
  [ ${#names[@]} -ge 3 ] || return 0
  local f=${names[0]} n=${names[1]} h=${names[2]}
  awk -v f="${RPS[$f]}" -v n="${RPS[$n]}" -v h="${RPS[$h]}" -v fp="${P99[$f]}" \
      -v np="${P99[$n]}" -v hp="${P99[$h]}" \
      -v fc="${CPU[$f]}" -v nc="${CPU[$n]}" -v hc="${CPU[$h]}" 'BEGIN{
    best = (h > n) ? "haproxy" : "nginx"; b = (h > n) ? h : n; bp = (h > n) ? hp : np
    printf "ratio req/s    ferry/nginx %.2f  ferry/haproxy %.2f  ferry/best(%s) %.2f  (goal >= 1.30)\n", f/n, f/h, best, f/b
    printf "ratio p99      ferry/nginx %.2f  ferry/haproxy %.2f  ferry/best(%s) %.2f  (goal <= 1.00)\n", fp/np, fp/hp, best, fp/bp
    printf "ratio cpu/req  nginx/ferry %.2f  haproxy/ferry %.2f  (requests per core-second, ferry vs peer)\n", nc/fc, hc/fc
  }'
  printf 'same-round ratios, median of %d: req/s ferry/best %.2f   cpu/req best/ferry %.2f   (rounds:%s |%s)\n' \
    "$ROUNDS" "$(median <<<"$pr_rps")" "$(median <<<"$pr_cpu")" "$pr_rps" "$pr_cpu"
  if [ -n "${RPS[hyper]:-}" ] && [ "$f" = ferry ]; then
    awk -v f="${RPS[ferry]}" -v y="${RPS[hyper]}" -v fc="${CPU[ferry]}" -v yc="${CPU[hyper]}" \
      'BEGIN{printf "ferry fast path vs its hyper path (hyper = Ferry without the fast path): req/s %.2f  cpu/req %.2f\n", f/y, yc/fc}'
  fi
}
# shellcheck disable=SC2086
# MINI=1 adds the bare relays to the same interleaved rounds (the floor of a proxy's cost per
# request on epoll, io_uring and tokio; same origin, same wrk).
suite "plain HTTP" ${PROXIES:-ferry nginx haproxy hyper} ${MINI:+mini-epoll mini-uring mini-fixed mini-tokio}
if [ -n "${TLS:-}" ]; then
  # HTTPS (TLS 1.3, the same ECDSA certificate; keep-alive, so no handshakes in the loop).
  suite "HTTPS" ferry-tls nginx-tls haproxy-tls
fi
