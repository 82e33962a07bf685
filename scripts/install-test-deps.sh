#!/usr/bin/env bash
# System packages some tests use; idempotent (does nothing when everything is present).
# - promtool (Debian's `prometheus` package): the token-processor's process test runs
#   `promtool check metrics` on a real /metrics scrape whenever promtool is installed.
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "install-test-deps: no apt-get; install promtool (prometheus) yourself" >&2
  fi
fi
command -v promtool >/dev/null 2>&1 && promtool --version 2>&1 | head -1 || true
