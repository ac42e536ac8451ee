#!/usr/bin/env bash
# Runs every test: installs what the tests need if missing, then unit, integration and doc
# tests with all features, in the crate and in bench/ (the chart binaries' tests and the
# check that proto/helloworld.rs is what its generator writes). Tests that need Redis start
# their own redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo test --workspace --all-features --lib --bins --tests --examples
cargo test --workspace --all-features --doc
