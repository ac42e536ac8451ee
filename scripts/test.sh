#!/usr/bin/env bash
# Runs every test: installs what the tests need if missing, then unit, integration and doc
# tests with all features. Tests that need Redis start their own redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo test --all-features --lib --tests --examples
cargo test --all-features --doc
