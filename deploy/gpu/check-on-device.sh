#!/usr/bin/env bash
# On the GPU machine, after install-offline.sh: the GPU tests and the trainer bench, results under $OUT.
#
#   eval "$(deploy/gpu/install-offline.sh --chunks CHUNKS --target /tmp/dgrpo-site)"
#   OUT=/path/to/results deploy/gpu/check-on-device.sh [imports|serving|runs|bench|vllm-bench|all]...
#
# Parts (default: all, in this order), so each fits a 10-minute command on a lent machine:
#   imports  the image's freeze, GPU, libc and versions, and an import of every module the GPU path loads
#   serving  pytest -m gpu tests/gpu/test_vllm_serving.py   (vLLM's serving contract)
#   runs     pytest -m gpu tests/gpu/test_training_run_vllm.py  (sync, shared, pipelined TrainingRuns)
#   bench    bench/gpu_trainer.py  (trainer logprob agreement, step time, OOM halving on CUDA)
#   vllm-bench  bench/gpu_vllm.py  (vLLM tok/s, adapter swap latency, sleep/wake seconds)
#   shapes   deploy/gpu/production_shapes.py  (Qwen3 0.6B/4B/8B shapes, random weights; its own 450 s budget;
#            named alone, never part of `all`): $OUT/shapes/shapes.json and its servers' logs.tar.gz
# Writes into $OUT (a lent machine returns at most 8 files): check.log (every part's output), env.txt and
# image.freeze (imports), gpu-results.json (what each test and bench measured), logs.tar.gz (the parts'
# full logs and the tails of the vLLM and worker logs). Exit status: non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:?set OUT to the directory for the results}"
python="${PYTHON:-python3}"
mkdir -p "$out"
work="${DGRPO_GPU_WORK:-/tmp/dgrpo-gpu}"  # kept between calls while the machine is: converted model, logs
mkdir -p "$work/results" "$work/pytest" "$work/logs"
export DGRPO_CACHE="$work/cache" DGRPO_GPU_RESULTS="$work/results" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
parts=("$@")
if [ ${#parts[@]} -eq 0 ] || [ "${parts[*]}" = all ]; then parts=(imports serving runs bench vllm-bench); fi
failed=()
for part in "${parts[@]}"; do
    case "$part" in
        imports|serving|runs|bench|vllm-bench|shapes) ;;
        *) echo "check-on-device.sh: unknown part $part (imports, serving, runs, bench, vllm-bench, shapes)" >&2; exit 2 ;;
    esac
done

run_part() {  # name, command...: output to $work/logs/<name>.log, appended to $OUT/check.log; tail to stdout
    local name="$1" log="$work/logs/$1.log" status=ok; shift
    echo "== $name: $*" >&2
    "$@" >"$log" 2>&1 || { status=FAILED; failed+=("$name"); }
    { echo "===== $name: $status"; cat "$log"; } >>"$out/check.log"
    tail -n 25 "$log"
    echo "== $name: $status" >&2
}

imports() {
    local rc=0
    "$python" -m pip list --format=freeze >"$out/image.freeze"
    {
        nvidia-smi || true
        "$python" -c 'import platform, sys; print(sys.version); print("libc", *platform.libc_ver())'
        "$python" -c 'import torch, transformers, vllm; print("torch", torch.__version__, "cuda", torch.version.cuda); print("transformers", transformers.__version__, "vllm", vllm.__version__)'
    } >"$out/env.txt" 2>&1
    # Every module the GPU path imports at start: a wheel the wheelhouse lacks fails here, by name.
    "$python" - <<'EOF' || rc=1
import importlib
modules = [
    "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core", "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama", "vllm.v1.attention.backends.flash_attn", "vllm.lora.worker_manager",
    "vllm.device_allocator.cumem", "temporalio.client", "minio", "openai", "fastapi", "uvicorn", "gguf",
    "peft", "matplotlib.pyplot", "serving.launchers", "workers.worker", "activities.training", "dgrpo",
    "pytest_asyncio", "pytest_timeout",
]
failed = []
for name in modules:
    try:
        importlib.import_module(name)
        print("ok  ", name)
    except Exception as err:  # report every one, not just the first
        failed.append(name)
        print("FAIL", name, type(err).__name__, err)
raise SystemExit(1 if failed else 0)
EOF
    command -v temporal && command -v weed || rc=1
    "$python" -c 'from base_models.resolve import ensure_smollm2; print(ensure_smollm2())' || rc=1  # convert once
    return $rc
}

gpu_tests() {
    "$python" -m pytest -m gpu "$@" -v -p no:cacheprovider --timeout 1800 --basetemp "$work/pytest/$(basename "$1" .py)"
}

for part in "${parts[@]}"; do
    case "$part" in
        imports) run_part imports imports ;;
        serving) run_part serving gpu_tests tests/gpu/test_vllm_serving.py ;;
        runs) run_part runs gpu_tests tests/gpu/test_training_run_vllm.py ;;
        bench) run_part bench "$python" bench/gpu_trainer.py --out "$work/results/gpu_trainer.json" ;;
        vllm-bench) run_part vllm-bench "$python" bench/gpu_vllm.py --out "$work/results/gpu_vllm.json" ;;
        shapes) run_part shapes "$python" deploy/gpu/production_shapes.py --out "$out/shapes" --work "$work" ;;
    esac
done

# What the tests measured, as one file; and the tails of the server and worker logs.
"$python" - "$work/results" "$out/gpu-results.json" <<'EOF'
import json, pathlib, sys
results = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(results, indent=2) + "\n")
EOF
mkdir -p "$work/log-tails"
find "$work/pytest" -name '*.log' -size +0 | while read -r log; do
    tail -n 2000 "$log" >"$work/log-tails/$(echo "${log#"$work/pytest/"}" | tr '/' '_')"
done
tar -czf "$out/logs.tar.gz" -C "$work" log-tails logs

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]} (see $out/check.log)" >&2
    exit 1
fi
echo "all parts passed: ${parts[*]}" >&2
