#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/fuzz_targets) with cargo-fuzz at the lowest CPU priority.
#   scripts/fuzz-run.sh [RUNS] [TARGET...]   (RUNS per target, default 10000000)
# cargo-fuzz needs nightly flags: on a stable toolchain RUSTC_BOOTSTRAP=1 allows them. Each
# target starts from fuzz/seeds/<target> plus the corpus of earlier runs (fuzz/corpus, not
# committed); findings land in fuzz/artifacts/<target>. The last line of each log says how many
# inputs ran ("Done N runs").
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs="${1:-10000000}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(json_body yaml_body protobuf_body strategic_merge json_patch label_selector field_selector dns_wire proxy_protocol)
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
nice -n 19 cargo fuzz build -s none --features libfuzzer
mkdir -p logs
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    nice -n 19 cargo fuzz run -s none --features libfuzzer "$t" "corpus/$t" "seeds/$t" -- \
        -runs="$runs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        > "logs/$t.log" 2>&1 || echo "$t: finding (see logs/$t.log and artifacts/$t)"
    grep -E "^Done [0-9]+ runs" "logs/$t.log" | sed "s/^/$t: /" || true
done
