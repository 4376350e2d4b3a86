#!/usr/bin/env bash
# Ingress proxy benchmark (not a test): HTTP/1.1 keep-alive requests/s and p99 latency through
# Ferry's Ingress data path vs nginx and HAProxy (Debian packages) configured equivalently —
# one frontend, Host/Prefix routing to one backend, keep-alive pooled upstream connections,
# X-Forwarded-For/-Proto/-Host and X-Real-IP set — each proxy pinned to ONE core (taskset),
# in the same run. The origin is an nginx answering 100-byte bodies; wrk and the origin share
# the other core. Loopback only.
#
#   bench/ingress/run.sh [SECONDS=10] [CONNECTIONS=64] [ROUNDS=2]
#
# Installs nginx, haproxy and wrk with apt-get when missing (needs root). Prints ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-10}
CONNS=${2:-64}
ROUNDS=${3:-2}
PROXY_CPU=1
LOAD_CPU=0
ORIGIN=127.0.0.1:18080
FERRY=127.0.0.1:18081
NGINX=127.0.0.1:18082
HAP=127.0.0.1:18083
HYPER=127.0.0.1:18084   # Ferry with the fast path off (hyper throughout): the "before"

need=()
for t in nginx haproxy wrk; do command -v "$t" >/dev/null 2>&1 || need+=("$t"); done
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "need root to install ${need[*]}" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
fi
# Debian's nginx package starts a service on port 80; this bench never uses it.

[ -n "${NO_BUILD:-}" ] || nice -n 19 cargo build -q --release -p ferry-ingress --example ingress_bench
BIN=target/release/examples/ingress_bench
W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

BODY=$(printf 'x%.0s' $(seq 1 99))   # 99 bytes + newline = 100-byte responses
mkdir -p "$W/origin" "$W/nginx"
cat >"$W/origin/nginx.conf" <<CFG
daemon off;
master_process off;
worker_processes 1;
user root;
pid $W/origin/nginx.pid;
error_log $W/origin/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen $ORIGIN reuseport backlog=4096;
    default_type text/plain;
    location / { return 200 "$BODY\n"; }
  }
}
CFG
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
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Real-IP \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$http_host;
      proxy_set_header X-Forwarded-Port \$server_port;
      proxy_buffering on;
      proxy_next_upstream error timeout;
    }
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
backend be
    retry-on conn-failure
    server s1 $ORIGIN
CFG

declare -A PID
taskset -c $LOAD_CPU nginx -c "$W/origin/nginx.conf" & PIDS+=($!)
taskset -c $PROXY_CPU env TOKIO_WORKER_THREADS=1 "$BIN" "$FERRY" "$ORIGIN" 0 & PIDS+=($!); PID[ferry]=$!
taskset -c $PROXY_CPU env FERRY_INGRESS_FAST=0 "$BIN" "$HYPER" "$ORIGIN" 0 & PIDS+=($!); PID[hyper]=$!
taskset -c $PROXY_CPU nginx -c "$W/nginx/nginx.conf" & PIDS+=($!); PID[nginx]=$!
taskset -c $PROXY_CPU haproxy -f "$W/haproxy.cfg" -db >/dev/null 2>&1 & PIDS+=($!); PID[haproxy]=$!
sleep 2
for a in $ORIGIN $FERRY $NGINX $HAP $HYPER; do
  curl -sf -H 'Host: bench.test' "http://$a/" >/dev/null || { echo "no answer from $a" >&2; exit 1; }
done

# wrk: requests/s, the p99 latency (in ms) and, when perf is there, the proxy's CPU time per
# request in microseconds (perf stat task-clock of the proxy process over the run): the cost
# that bounds requests/s when the proxy core is the bottleneck, and far less sensitive than
# requests/s to other jobs sharing the machine.
run() {
  local out rps p99 req cpu=0 sp=""
  if [ "$PERF" = 1 ]; then
    perf stat -x, -e task-clock -p "$2" -o "$W/stat" -- sleep $((SECS + 1)) >/dev/null 2>&1 & sp=$!
    sleep 0.2
  fi
  out=$(taskset -c $LOAD_CPU wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -H 'Host: bench.test' "http://$1/")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  req=$(awk '/requests in/ {print $1}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v=v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v=v*1000}; print v}' <<<"$out")
  if [ -n "$sp" ]; then
    wait "$sp" || true
    cpu=$(awk -F, -v r="$req" '$3=="task-clock" || $3 ~ /^task-clock/ {printf "%.2f", $1*1000/r}' "$W/stat")
  fi
  echo "$rps $p99 ${cpu:-0}"
}
PERF=0
if command -v perf >/dev/null 2>&1 && perf stat -e task-clock -- true >/dev/null 2>&1; then PERF=1; fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t1 -c$CONNS -d${SECS}s keep-alive, 100-byte bodies, proxies on cpu $PROXY_CPU, $ROUNDS rounds =="
declare -A RPS P99 CPU
NAMES="ferry nginx haproxy hyper"
for name in $NAMES; do RPS[$name]=0; P99[$name]=0; CPU[$name]=0; done
for r in $(seq 1 "$ROUNDS"); do
  for name in $NAMES; do
    case $name in ferry) a=$FERRY;; nginx) a=$NGINX;; haproxy) a=$HAP;; hyper) a=$HYPER;; esac
    read -r rps p99 cpu < <(run "$a" "${PID[$name]}")
    printf '  round %d %-8s %10.0f req/s   p99 %7.2f ms   cpu %6.2f us/req\n' "$r" "$name" "$rps" "$p99" "$cpu"
    CPU[$name]=$(awk -v a="${CPU[$name]}" -v b="$cpu" 'BEGIN{print a+b}')
    RPS[$name]=$(awk -v a="${RPS[$name]}" -v b="$rps" 'BEGIN{print a+b}')
    P99[$name]=$(awk -v a="${P99[$name]}" -v b="$p99" 'BEGIN{print (b>a)?b:a}')
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== mean req/s, worst p99 over rounds (hyper = Ferry without its fast path) =="
for name in $NAMES; do
  RPS[$name]=$(awk -v a="${RPS[$name]}" -v n="$ROUNDS" 'BEGIN{printf "%.0f", a/n}')
  CPU[$name]=$(awk -v a="${CPU[$name]}" -v n="$ROUNDS" 'BEGIN{printf "%.2f", a/n}')
  printf '  %-8s %10s req/s   p99 %7s ms   cpu %6s us/req\n' "$name" "${RPS[$name]}" "${P99[$name]}" "${CPU[$name]}"
done
best=nginx
if awk -v h="${RPS[haproxy]}" -v n="${RPS[nginx]}" 'BEGIN{exit !(h>n)}'; then best=haproxy; fi
awk -v f="${RPS[ferry]}" -v n="${RPS[nginx]}" -v h="${RPS[haproxy]}" -v fp="${P99[ferry]}" \
    -v np="${P99[nginx]}" -v hp="${P99[haproxy]}" -v best="$best" -v y="${RPS[hyper]}" \
    -v fc="${CPU[ferry]}" -v nc="${CPU[nginx]}" -v hc="${CPU[haproxy]}" -v yc="${CPU[hyper]}" 'BEGIN{
  printf "ratio req/s  ferry/nginx %.2f  ferry/haproxy %.2f  ferry/best(%s) %.2f  (goal >= 1.30)\n", f/n, f/h, best, f/(best=="nginx"?n:h)
  printf "ratio req/s  ferry/ferry-hyper-path %.2f\n", f/y
  if (fc > 0) printf "ratio cpu/req (peer/ferry: requests/s per core)  nginx %.2f  haproxy %.2f  ferry-hyper-path %.2f\n", nc/fc, hc/fc, yc/fc
  printf "ratio p99    ferry/nginx %.2f  ferry/haproxy %.2f  ferry/best(%s) %.2f  (goal <= 1.00)\n", fp/np, fp/hp, best, fp/(best=="nginx"?np:hp)
}'
