#!/usr/bin/env bash
# Makes .venv at the repository root with the official `openai` Python client, which the
# integration tests drive the api-server with. Idempotent: does nothing when the venv already
# imports a matching openai.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
want="openai>=1.40,<3"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
major, minor = (int(x) for x in m.version("openai").split(".")[:2])
sys.exit(0 if (major, minor) >= (1, 40) and major < 3 else 1)
PY
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$want" >&2
"$venv/bin/python" -c 'import openai; print("setup-python: openai", openai.__version__)' >&2
