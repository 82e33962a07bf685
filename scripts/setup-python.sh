#!/usr/bin/env bash
# Makes .venv at the repository root with the official `openai` Python client, which the
# integration tests drive the api-server with, and the `gguf` package (with numpy), with which
# scripts/make-draft.py writes the draft models the draft-model tests serve, and `jsonschema`,
# against which the structured-output test validates every output. Idempotent: does nothing
# when the venv already imports a matching openai, gguf and jsonschema.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
want=("openai>=1.40,<3" "gguf==0.19.0" "numpy>=1.26" "jsonschema>=4.18,<5")

if [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
major, minor = (int(x) for x in m.version("openai").split(".")[:2])
ok = (major, minor) >= (1, 40) and major < 3 and m.version("gguf") == "0.19.0"
import gguf, numpy, jsonschema  # noqa: F401  (all must import, not only be listed)
sys.exit(0 if ok else 1)
PY
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${want[@]}" >&2
"$venv/bin/python" -c 'import openai, gguf, jsonschema; print("setup-python: openai", openai.__version__, "gguf and jsonschema ok")' >&2
