#!/usr/bin/env bash
# Runs Ferry's whole test suite: installs what the tests need, then every crate's unit,
# integration and end-to-end tests (the end-to-end tests start the real `ferry` binary and drive
# it with kubectl, Debian's kubectl 1.20 and the Python client).
set -euo pipefail
cd "$(dirname "$0")/.."
K120=$(bash scripts/test-deps.sh | tail -n 1)
export FERRY_KUBECTL_120="$K120"
export RUST_BACKTRACE=1
# A clean run gains nothing from incremental artifacts; they would take several GB of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "disk before the build: $(df -h . | tail -n 1)"
# No unused dependencies (a crate ignores one only in its [package.metadata.cargo-machete]).
cargo machete
# No `Result<_, String>` in crate source.
bash scripts/no-string-errors.sh
cargo test --workspace --no-fail-fast -- --test-threads="${FERRY_TEST_THREADS:-2}"
# Every fuzz target, briefly (about 5 s each).
bash scripts/fuzz-smoke.sh
