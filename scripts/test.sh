#!/usr/bin/env bash
# The project's test command: every crate's unit, property and integration tests, including
# the SmolLM2 reference checks (needs scripts/fetch-model.sh first; .ci/run does both).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets 2>&1
