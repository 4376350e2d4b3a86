#!/usr/bin/env bash
# Scale benchmark (issue 19): 10,000 Services (1,000 headless with EndpointSlices) and 150,000
# Pods with pod IPs loaded through the API of a real `ferry apiserver` (plain HTTP on loopback),
# then: API server RSS after the load and after a restart, the time a plain kube-rs client needs
# to list+watch everything (pages of 500), and start-to-ready time + RSS of `ferry dns`,
# `ferry proxy` (nftables --dry-run: list, render, exit), `ferry netpol agent` (--dry-run, and
# live in a network namespace of its own when root), `ferry ingress`, `ferry controllers` and
# one node agent (`ferry agent`: registers a Node, lists its pods by field selector; the Node is
# deleted after).
# Each figure is printed against the issue's goal. Loopback only; nothing leaves the machine.
#
# Env: FERRY_BIN (default target/release/ferry, built if missing; PROFILE=debug for the debug
#      build), SERVICES (10000), HEADLESS (1000), PODS (150000), NAMESPACES (100), CLIENTS (8),
#      PORT (16480), DATA (reuse an already loaded data dir: skip the load; kept afterwards),
#      CTL_TIMEOUT (s to wait for the controllers, default 300),
#      SKIP_BUILD=1 with FERRY_BIN/SYNC_BIN to run given binaries (e.g. a before/after pair).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PROFILE="${PROFILE:-release}"
SERVICES="${SERVICES:-10000}"; HEADLESS="${HEADLESS:-1000}"; PODS="${PODS:-150000}"
NAMESPACES="${NAMESPACES:-100}"; CLIENTS="${CLIENTS:-8}"; PORT="${PORT:-16480}"
DNS_PORT=$((PORT + 1)); DNS_METRICS=$((PORT + 2)); PROXY_HEALTH=$((PORT + 3))

flag=(); [ "$PROFILE" = release ] && flag=(--release)
echo "== building ($PROFILE)"
[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build "${flag[@]}" -q -p ferry --bin ferry && cargo build "${flag[@]}" -q -p ferry-dns --example scale_sync)
BIN="${FERRY_BIN:-$ROOT/target/$PROFILE/ferry}"
SYNC="${SYNC_BIN:-$ROOT/target/$PROFILE/examples/scale_sync}"

WORK="$(mktemp -d /tmp/ferry-scale-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${NS:-}" ] && [ -e "/run/netns/$NS" ]; then ip netns del "$NS" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ -n "${DATA:-}" ]; then D="$DATA"; LOADED=1; else D="$WORK/data"; LOADED=0; fi
export KUBECONFIG="$D/kubeconfig"
URL="http://127.0.0.1:$PORT"

rss_mib() { awk '/^VmRSS:/ {printf "%.0f", $2/1024}' "/proc/$1/status"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }
goal() { awk -v v="$2" -v g="$3" -v n="$1" -v u="$4" 'BEGIN {printf "   %-44s %10.2f %-4s goal <= %-6s %s\n", n, v, u, g, (v <= g ? "OK" : "MISSED x" sprintf("%.1f", v / g))}'; }

start_api() {
  "$BIN" apiserver --data-dir "$D" --listen-api "127.0.0.1:$PORT" --plain-http >>"$WORK/api.log" 2>&1 &
  API=$!; PIDS+=("$API")
  local t0; t0=$(now)
  until grep -q "API server ready" "$WORK/api.log" 2>/dev/null && [ -f "$KUBECONFIG" ]; do
    kill -0 "$API" || { cat "$WORK/api.log"; exit 1; }; sleep 0.2
  done
  API_START=$(secs "$t0" "$(now)")
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }

: >"$WORK/api.log"
start_api
TOKEN=$(awk '/token:/ {print $2; exit}' "$KUBECONFIG")
if [ "$LOADED" = 0 ]; then
  echo "== loading $SERVICES Services ($HEADLESS headless + EndpointSlices), $PODS Pods, $CLIENTS clients"
  nice -n 10 python3 "$ROOT/bench/scale/load.py" "$URL" "$TOKEN" --namespaces "$NAMESPACES" \
    --services "$SERVICES" --headless "$HEADLESS" --pods "$PODS" --clients "$CLIENTS" | sed 's/^/   /'
fi
# The objects the server holds, from its /metrics (upstream's apiserver_storage_objects): a data
# dir reused with DATA also holds what earlier runs' clients wrote (the controllers' Events and
# status patches), so the generated count would understate it.
count_objects() {
  curl -sf -H "Authorization: Bearer $TOKEN" "$URL/metrics" | awk '/^apiserver_storage_objects\{/ {n += $2} END {print n + 0}'
}
GENERATED=$((SERVICES + HEADLESS + PODS + 2 * NAMESPACES))
OBJECTS=$(count_objects); [ "${OBJECTS:-0}" -gt 0 ] || OBJECTS=$GENERATED
RSS_LOADED=$(rss_mib "$API")
echo "== API server ($OBJECTS objects, $GENERATED generated): RSS after load ${RSS_LOADED} MiB, store $(du -m "$D/store.redb" | cut -f1) MB"
stop "$API"
: >"$WORK/api.log"
start_api
sleep 2
RSS_RESTART=$(rss_mib "$API")
echo "== API server restart: ready in ${API_START} s, RSS ${RSS_RESTART} MiB"

echo "== kube-rs client: list+watch pods, services, endpointslices (pages of 500)"
t0=$(now); "$SYNC" | sed 's/^/   /'; KUBE_SYNC=$(secs "$t0" "$(now)")
echo "== kube-rs client: the same with streaming lists (sendInitialEvents watch-list)"
t0=$(now); STREAMING=1 "$SYNC" | sed 's/^/   /'; KUBE_STREAM=$(secs "$t0" "$(now)")
RSS_AFTER_CLIENT=$(rss_mib "$API")

echo "== ferry dns --pods verified"
t0=$(now)
"$BIN" dns --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$DNS_PORT" --metrics-listen "127.0.0.1:$DNS_METRICS" \
  --pods verified --upstream 127.0.0.1:9 --udp-workers 1 >"$WORK/dns.log" 2>&1 &
DNS=$!; PIDS+=("$DNS")
until curl -sf "http://127.0.0.1:$DNS_METRICS/readyz" >/dev/null; do
  kill -0 "$DNS" || { cat "$WORK/dns.log"; exit 1; }; sleep 0.1
done
DNS_READY=$(secs "$t0" "$(now)"); sleep 1; DNS_RSS=$(rss_mib "$DNS"); stop "$DNS"
echo "   ready in ${DNS_READY} s, RSS ${DNS_RSS} MiB"

echo "== ferry proxy --proxy-mode nftables --dry-run (list everything, render the ruleset, exit)"
t0=$(now)
/usr/bin/time -f "%M" -o "$WORK/proxy.time" "$BIN" proxy --kubeconfig "$KUBECONFIG" --node-name bench-node \
  --proxy-mode nftables --dry-run --healthz-bind-address "" >"$WORK/rules.nft" 2>"$WORK/proxy.log"
PROXY_READY=$(secs "$t0" "$(now)"); PROXY_RSS=$(awk '{printf "%.0f", $1/1024}' "$WORK/proxy.time")
echo "   done in ${PROXY_READY} s, peak RSS ${PROXY_RSS} MiB, $(wc -l <"$WORK/rules.nft") ruleset lines"

echo "== ferry netpol agent --dry-run (list + watch policies, pods, namespaces, nodes; render the node's table; exit)"
t0=$(now)
/usr/bin/time -f "%M" -o "$WORK/netpol.time" "$BIN" netpol --kubeconfig "$KUBECONFIG" agent --node-name bench-node \
  --dry-run >"$WORK/netpol.nft" 2>"$WORK/netpol.log"
NETPOL_DRY=$(secs "$t0" "$(now)"); NETPOL_PEAK=$(awk '{printf "%.0f", $1/1024}' "$WORK/netpol.time")
echo "   done in ${NETPOL_DRY} s, peak RSS ${NETPOL_PEAK} MiB; $(grep -o 'synced in.*' "$WORK/netpol.log")"
# The live agent (applies its table with nft in a network namespace of its own): root only.
NETPOL_READY=""; NETPOL_RSS=""
if [ "$(id -u)" = 0 ] && command -v nft >/dev/null; then
  NS="ferry-scale-netpol-$$"
  ip netns add "$NS"
  echo "== ferry netpol agent (live, table applied in netns $NS; until \"synced and applied\")"
  t0=$(now)
  RUST_LOG=info "$BIN" netpol --kubeconfig "$KUBECONFIG" agent --node-name bench-node --netns "/run/netns/$NS" \
    --cleanup-on-exit >"$WORK/netpol-live.log" 2>&1 &
  NP=$!; PIDS+=("$NP")
  until grep -q "synced and applied" "$WORK/netpol-live.log" 2>/dev/null; do
    kill -0 "$NP" || { cat "$WORK/netpol-live.log"; ip netns del "$NS"; exit 1; }; sleep 0.1
  done
  NETPOL_READY=$(secs "$t0" "$(now)"); sleep 1; NETPOL_RSS=$(rss_mib "$NP"); stop "$NP"
  ip netns del "$NS"
  echo "   synced and applied in ${NETPOL_READY} s, RSS ${NETPOL_RSS} MiB"
fi

echo "== ferry ingress (watches Ingresses, classes, every Service and EndpointSlice, TLS Secrets; until the first route table)"
t0=$(now)
RUST_LOG=info "$BIN" ingress --kubeconfig "$KUBECONFIG" --http-addr "127.0.0.1:$((PORT + 4))" \
  --https-addr "127.0.0.1:$((PORT + 5))" >"$WORK/ingress.log" 2>&1 &
ING=$!; PIDS+=("$ING")
until grep -q "first route table served" "$WORK/ingress.log" 2>/dev/null; do
  kill -0 "$ING" || { cat "$WORK/ingress.log"; exit 1; }; sleep 0.1
done
ING_READY=$(secs "$t0" "$(now)"); sleep 1; ING_RSS=$(rss_mib "$ING"); stop "$ING"
echo "   first route table in ${ING_READY} s, RSS ${ING_RSS} MiB"

echo "== ferry controllers (until \"service controllers synced\")"
t0=$(now)
RUST_LOG=info "$BIN" controllers --kubeconfig "$KUBECONFIG" --leader-elect=false >"$WORK/ctl.log" 2>&1 &
CTL=$!; PIDS+=("$CTL")
# Bounded: report "not synced" (with the time waited) rather than waiting forever.
deadline=$(awk -v t="$t0" -v d="${CTL_TIMEOUT:-300}" 'BEGIN {printf "%.3f", t + d}')
ctl_state="synced"
until grep -q "service controllers synced" "$WORK/ctl.log"; do
  kill -0 "$CTL" || { cat "$WORK/ctl.log"; exit 1; }
  if awk -v n="$(now)" -v d="$deadline" 'BEGIN {exit !(n > d)}'; then ctl_state="NOT synced"; break; fi
  sleep 0.1
done
CTL_READY=$(secs "$t0" "$(now)"); CTL_RSS=$(rss_mib "$CTL"); stop "$CTL"
echo "   $ctl_state after ${CTL_READY} s, RSS ${CTL_RSS} MiB"

# Last: the node agent registers a Node (the scheduler of the controllers above would bind pods
# to it); removed again afterwards.
echo "== ferry agent (one node: register, list its pods by spec.nodeName; until \"pods listed\")"
t0=$(now)
RUST_LOG=info "$BIN" agent --kubeconfig "$KUBECONFIG" --node-name bench-node --state-dir "$WORK/agent" --port 0 \
  --isolation off --insecure-allow-unauthenticated >"$WORK/agent.log" 2>&1 &
AG=$!; PIDS+=("$AG")
until grep -q "pods listed" "$WORK/agent.log" 2>/dev/null; do
  kill -0 "$AG" || { cat "$WORK/agent.log"; exit 1; }; sleep 0.1
done
AGENT_READY=$(secs "$t0" "$(now)"); sleep 1; AGENT_RSS=$(rss_mib "$AG"); stop "$AG"
for path in api/v1/nodes/bench-node apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/bench-node; do
  curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $TOKEN" "$URL/$path" || true
done
echo "   pods listed in ${AGENT_READY} s, RSS ${AGENT_RSS} MiB"

echo
echo "== against the issue's goals ($PROFILE build of $(cd "$ROOT" && git rev-parse --short HEAD))"
goal "API server KiB per object, after load" "$(awk -v r="$RSS_LOADED" -v n="$OBJECTS" 'BEGIN {print r * 1024 / n}')" 2 KiB
goal "API server KiB per object, after restart" "$(awk -v r="$RSS_RESTART" -v n="$OBJECTS" 'BEGIN {print r * 1024 / n}')" 2 KiB
goal "API server RSS after restart" "$RSS_RESTART" 400 MiB
goal "kube-rs client list+watch (paged)" "$KUBE_SYNC" 5 s
goal "kube-rs client list+watch (streaming)" "$KUBE_STREAM" 5 s
goal "ferry dns start to ready" "$DNS_READY" 5 s
goal "ferry dns RSS" "$DNS_RSS" 70 MiB
goal "ferry proxy (nftables dry-run) start to done" "$PROXY_READY" 5 s
goal "ferry controllers start to $ctl_state" "$CTL_READY" 5 s
goal "ferry netpol agent (dry-run) start to done" "$NETPOL_DRY" 5 s
[ -z "$NETPOL_READY" ] || goal "ferry netpol agent start to applied" "$NETPOL_READY" 5 s
goal "ferry agent (node) start to pods listed" "$AGENT_READY" 5 s
goal "ferry ingress start to first route table" "$ING_READY" 5 s
echo "   (API server RSS after the kube-rs client's list: ${RSS_AFTER_CLIENT} MiB; proxy peak RSS ${PROXY_RSS} MiB; controllers RSS ${CTL_RSS} MiB)"
echo "   (netpol agent: dry-run peak RSS ${NETPOL_PEAK} MiB${NETPOL_RSS:+, live RSS ${NETPOL_RSS} MiB}; node agent RSS ${AGENT_RSS} MiB; ingress RSS ${ING_RSS} MiB)"
