#!/usr/bin/env bash
# Programming-latency benchmark (issue 18): at SERVICES Services, the time from an API write
# (plain HTTP from bench/latency/driver.py, no kubectl) to
#   (a) `ferry dns` answering the new Service's ClusterIP, and
#   (b) the service proxy forwarding new connections to a moved endpoint: the userspace proxy,
#       then the nftables proxy,
# p50/p99 over CHANGES changes each. Everything runs in a throwaway network namespace (root):
# the API server, `ferry dns`, `ferry proxy`, the backends and the driver, on its loopback; the
# Service CIDR is routed locally there so the userspace proxy can bind ClusterIPs. Without root
# only (a) runs (on the machine's loopback).
#
# Peers: none runs here. CoreDNS and kube-proxy are not installed; the reference figure is
# Kubernetes' own SLO as measured by clusterloader2 (network programming latency, 30 s p99),
# printed as a ratio. The goal of issue 18 is <= 100 ms p99.
#
# Env: FERRY_BIN (default target/release/ferry, built unless SKIP_BUILD=1), SERVICES (10000),
#      CHANGES (200), GAP (mean ms between changes, 100), PORT (16580), DATA (a data dir: loaded
#      with SERVICES Services when it holds none yet, reused otherwise; kept afterwards), MODES
#      ("userspace nftables"), DNS_PART (0 skips the DNS part), LOGS (a directory to copy the
#      servers' logs into at the end).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SERVICES="${SERVICES:-10000}"; CHANGES="${CHANGES:-200}"; GAP="${GAP:-100}"; PORT="${PORT:-16580}"
MODES="${MODES:-userspace nftables}"
DNS_PORT=$((PORT + 1)); DNS_METRICS=$((PORT + 2)); PROXY_HEALTH=$((PORT + 3))
SLO_MS=30000; GOAL_MS=100

[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release -q -p ferry --bin ferry)
BIN="${FERRY_BIN:-$ROOT/target/release/ferry}"

WORK="$(mktemp -d /tmp/ferry-latency-bench.XXXXXX)"
NS=""
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "$NS" ] && ip netns del "$NS" 2>/dev/null || true
  if [ -n "${LOGS:-}" ]; then mkdir -p "$LOGS" && cp "$WORK"/*.log "$LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" = 0 ]; then
  NS="ferry-lat-$$"
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  # ClusterIPs (the API server's default 10.96.0.0/12) are local addresses in this namespace;
  # the backends live on 10.250.0.1.
  ip -n "$NS" route add local 10.96.0.0/12 dev lo
  ip -n "$NS" addr add 10.250.0.1/32 dev lo
  # `ip netns exec` execs the command: $! of a background "${X[@]}" is the server itself.
  X=(ip netns exec "$NS")
else
  echo "not root: only the DNS part runs (the proxy needs a network namespace)"
  MODES=""
  X=()
fi

# DATA: loaded here when it holds no cluster yet, reused as it is otherwise; kept either way.
if [ -n "${DATA:-}" ]; then D="$DATA"; LOADED=0; [ -f "$DATA/kubeconfig" ] && LOADED=1; else D="$WORK/data"; LOADED=0; fi
KUBECONFIG="$D/kubeconfig"; export KUBECONFIG
URL="http://127.0.0.1:$PORT"

"${X[@]}" "$BIN" apiserver --data-dir "$D" --listen-api "127.0.0.1:$PORT" --plain-http >"$WORK/api.log" 2>&1 &
PIDS+=($!)
until grep -q "API server ready" "$WORK/api.log" 2>/dev/null && [ -f "$KUBECONFIG" ]; do
  kill -0 "${PIDS[0]}" || { cat "$WORK/api.log"; exit 1; }; sleep 0.2
done
TOKEN=$(awk '/token:/ {print $2; exit}' "$KUBECONFIG")
if [ "$LOADED" = 0 ]; then
  echo "== loading $SERVICES Services (1 in 10 headless) and their EndpointSlices through the API"
  "${X[@]}" nice -n 10 python3 "$ROOT/bench/scale/load.py" "$URL" "$TOKEN" --services "$SERVICES" \
    --headless $((SERVICES / 10)) --pods 0 | sed 's/^/   /'
  # Every Service gets an endpoint (nothing listens there), so the proxies hold full tables.
  "${X[@]}" nice -n 10 python3 "$ROOT/bench/latency/driver.py" slices "$URL" "$TOKEN" 10.250.0.2 \
    --services "$SERVICES" | sed 's/^/   /'
fi

RESULTS=()
if [ "${DNS_PART:-1}" != 0 ]; then
echo "== ferry dns"
"${X[@]}" "$BIN" dns --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$DNS_PORT" --metrics-listen "127.0.0.1:$DNS_METRICS" \
  --upstream 127.0.0.1:9 --udp-workers 1 >"$WORK/dns.log" 2>&1 &
DNS=$!; PIDS+=("$DNS")
until "${X[@]}" curl -sf "http://127.0.0.1:$DNS_METRICS/readyz" >/dev/null; do
  kill -0 "$DNS" || { cat "$WORK/dns.log"; exit 1; }; sleep 0.1
done

echo "== $CHANGES changes, ~$GAP ms apart, $SERVICES Services loaded"
line=$("${X[@]}" python3 "$ROOT/bench/latency/driver.py" dns "$URL" "$TOKEN" "127.0.0.1:$DNS_PORT" --changes "$CHANGES" --gap "$GAP")
echo "   $line"; RESULTS+=("$line")
kill "$DNS" 2>/dev/null || true; wait "$DNS" 2>/dev/null || true
fi

base=31000
for mode in $MODES; do
  echo "== ferry proxy --proxy-mode $mode"
  "${X[@]}" "$BIN" proxy --kubeconfig "$KUBECONFIG" --node-name latency-node --proxy-mode "$mode" \
    --healthz-bind-address "127.0.0.1:$PROXY_HEALTH" >"$WORK/proxy-$mode.log" 2>&1 &
  PX=$!; PIDS+=("$PX")
  t0=$(date +%s)
  until "${X[@]}" curl -sf "http://127.0.0.1:$PROXY_HEALTH/healthz" >/dev/null; do
    kill -0 "$PX" || { tail -20 "$WORK/proxy-$mode.log"; exit 1; }
    [ $(($(date +%s) - t0)) -lt 300 ] || { echo "proxy not healthy after 300 s"; exit 1; }
    sleep 0.2
  done
  line=$("${X[@]}" python3 "$ROOT/bench/latency/driver.py" proxy "$URL" "$TOKEN" 10.250.0.1 --changes "$CHANGES" \
    --gap "$GAP" --base-port "$base" --label "$mode")
  echo "   $line"; RESULTS+=("$line")
  kill "$PX" 2>/dev/null || echo "   (the proxy had exited: $(grep -m1 -E 'panicked|Error|error' "$WORK/proxy-$mode.log"))"; wait "$PX" 2>/dev/null || true
  base=$((base + CHANGES + 10))
done

echo
echo "== against the goal (${GOAL_MS} ms p99) and clusterloader2's SLO (${SLO_MS} ms p99); release build of $(cd "$ROOT" && git rev-parse --short HEAD)"
for r in "${RESULTS[@]}"; do
  p99=$(echo "$r" | sed -n 's/.* p99=\([0-9.]*\) max.*/\1/p')
  awk -v n="${r%%:*}" -v p="$p99" -v g="$GOAL_MS" -v s="$SLO_MS" \
    'BEGIN {printf "   %-22s p99 %8.2f ms  %s  SLO/ferry = %.0fx\n", n, p, (p <= g ? "goal met" : "goal MISSED"), s / p}'
done
