#!/usr/bin/env bash
# Installs libnvrtc (CUDA 12's runtime compiler, used by the `cuda` feature to compile
# engine-worker/kernels/*.cu) from the PyPI wheel `nvidia-cuda-nvrtc-cu12`, and makes it loadable
# by name (`libnvrtc.so.12`, what cudarc's dynamic loader asks for) with no further setup.
#
# Idempotent: does nothing when the pinned version is installed and registered. No GPU and no CUDA
# toolkit are needed; NVRTC only compiles.
#
# As root the library directory is registered with the dynamic linker (/etc/ld.so.conf.d +
# ldconfig), so every later process finds it. Otherwise it prints the LD_LIBRARY_PATH to export.
#
# Env: NVRTC_WHEEL_VERSION (default 12.8.93, matching cudarc's `cuda-12080` feature),
#      NVRTC_PREFIX (default /opt/specula/nvrtc as root, ~/.local/share/specula/nvrtc otherwise).
set -euo pipefail

version="${NVRTC_WHEEL_VERSION:-12.8.93}"
if [ "$(id -u)" -eq 0 ]; then
  prefix="${NVRTC_PREFIX:-/opt/specula/nvrtc}"
else
  prefix="${NVRTC_PREFIX:-$HOME/.local/share/specula/nvrtc}"
fi
target="$prefix/$version"
libdir="$target/nvidia/cuda_nvrtc/lib"
ld_conf=/etc/ld.so.conf.d/specula-nvrtc.conf

if [ ! -e "$libdir/libnvrtc.so.12" ]; then
  python="$(command -v python3 || command -v python || true)"
  if [ -z "$python" ]; then
    echo "install-nvrtc: python3 with pip is needed to fetch nvidia-cuda-nvrtc-cu12" >&2
    exit 1
  fi
  echo "install-nvrtc: installing nvidia-cuda-nvrtc-cu12==$version into $target"
  rm -rf "$target.partial"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$target.partial" "nvidia-cuda-nvrtc-cu12==$version"
  rm -rf "$target"
  mv "$target.partial" "$target"
fi

if [ ! -e "$libdir/libnvrtc.so.12" ]; then
  echo "install-nvrtc: the wheel has no libnvrtc.so.12 under $libdir" >&2
  exit 1
fi
# Unversioned name too, for loaders that ask for plain libnvrtc.so.
ln -sf libnvrtc.so.12 "$libdir/libnvrtc.so"

if [ "$(id -u)" -eq 0 ]; then
  if [ "$(cat "$ld_conf" 2>/dev/null || true)" != "$libdir" ]; then
    echo "$libdir" >"$ld_conf"
  fi
  ldconfig
  # Not `ldconfig -p | grep -q`: grep's early exit would fail the pipeline under pipefail.
  registered="$(ldconfig -p)"
  if ! grep -q "libnvrtc.so.12 .*$libdir" <<<"$registered"; then
    echo "install-nvrtc: ldconfig does not list $libdir/libnvrtc.so.12" >&2
    exit 1
  fi
  echo "install-nvrtc: libnvrtc $version registered with the dynamic linker ($libdir)"
else
  echo "install-nvrtc: not root, so not registered system-wide; before the tests run:"
  echo "  export LD_LIBRARY_PATH=$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
fi
