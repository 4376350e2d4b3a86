#!/usr/bin/env bash
# A short, bounded run of every fuzz target (fuzz/): the seed corpus and random mutations of it,
# ~5 s per target without libFuzzer (no nightly flags needed). Set FERRY_FUZZ_SMOKE_SECS to
# change the time per target. Long runs: scripts/fuzz-run.sh.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export FERRY_FUZZ_SMOKE_SECS="${FERRY_FUZZ_SMOKE_SECS:-5}"
# The workspace's target directory: the dependencies it already built are reused.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}"
cargo test --test smoke -- --nocapture
