#!/usr/bin/env bash
# System packages some tests use; idempotent (does nothing when everything is present).
# - Debian's `prometheus` package: `promtool check metrics` on a real /metrics scrape, and a real
#   Prometheus server scraping a running stack (tests/prometheus_scrape.rs, tests/dashboard.rs).
# - systemd-analyze (Debian's `systemd`): `systemd-analyze verify` on scripts/systemd units.
# - a C++20 compiler (Debian's `g++`): the CUDA kernels run on a CPU emulator
#   (engine-worker/tests/cuda_kernels_emulated.rs), which fails without one under test.sh.
# - Debian's `chromium`: the what-if report renders in headless Chromium (tests/whatif_report.rs).
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "install-test-deps: no apt-get; install promtool (prometheus) yourself" >&2
  fi
fi
command -v promtool >/dev/null 2>&1 && promtool --version 2>&1 | head -1 || true
