#!/usr/bin/env bash
# Userspace service proxy benchmark (not a test): throughput and connections/s through
# ferry's userspace data path vs a direct connection vs HAProxy (Debian) configured the same
# way (one TCP frontend -> one backend, mode tcp), in the same run. Loopback only, bounded.
#
#   bench/proxy/run.sh [SECONDS=5] [CONNS=8]
#
# Installs haproxy with apt-get when missing (needs root); without it the HAProxy column is
# skipped. Prints ratios at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-5}
CONNS=${2:-8}
BACK=127.79.0.1:9000
FERRY=127.79.0.2:8080
HAP=127.79.0.3:8080

if ! command -v haproxy >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq haproxy >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq haproxy >/dev/null; }) || true
  fi
fi

cargo build -q --release -p ferry-proxy --example proxy_bench
BIN=target/release/examples/proxy_bench
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Backend and ferry on separate cores' worth of threads; everyone shares the machine.
"$BIN" backend "$BACK" & PIDS+=($!)
"$BIN" ferry "$FERRY" "$BACK" & PIDS+=($!)

HAVE_HAP=0
if command -v haproxy >/dev/null 2>&1; then
  CFG=$(mktemp)
  cat >"$CFG" <<CFG
global
    maxconn 4000
    nbthread $(nproc)
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
  haproxy -f "$CFG" -db >/dev/null 2>&1 & PIDS+=($!)
  HAVE_HAP=1
fi
sleep 2

run() { timeout $((SECS * 3 + 30)) "$BIN" load "$1" "$SECS" "$CONNS"; }
echo "== $SECS s per phase, $CONNS parallel connections, $(nproc) cores =="
D=$(run "$BACK");  echo "direct:  $D"
F=$(run "$FERRY"); echo "ferry:   $F"
if [ $HAVE_HAP = 1 ]; then H=$(run "$HAP"); echo "haproxy: $H ($(haproxy -v | head -1))"; fi

val() { echo "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "-- ratios --"
echo "ferry/direct:  throughput $(ratio "$(val "$F" gbps)" "$(val "$D" gbps)"), conn/s $(ratio "$(val "$F" cps)" "$(val "$D" cps)")"
if [ $HAVE_HAP = 1 ]; then
  echo "ferry/haproxy: throughput $(ratio "$(val "$F" gbps)" "$(val "$H" gbps)"), conn/s $(ratio "$(val "$F" cps)" "$(val "$H" cps)")"
fi
