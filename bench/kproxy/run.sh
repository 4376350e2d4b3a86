#!/usr/bin/env bash
# Kernel proxy benchmark (not a test): Ferry's nftables table vs kube-proxy's nftables layout
# vs iptables-restore, at 10,000 Services x 3 endpoints, in a throwaway network namespace the
# benchmark creates and removes. Needs root, nft, iptables, ip, python3.
#   bench/kproxy/run.sh [SERVICES] [SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p ferry-proxy --example kproxy_bench
exec nice -n 19 target/release/examples/kproxy_bench "${1:-10000}" "${2:-30}" ${3:+"$3"}
