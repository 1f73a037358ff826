#!/usr/bin/env bash
# Issue 43 on a lent GPU machine, at most 8 minutes in all (docs/scaling-out.md): each part's figures are written
# under $OUT as soon as it ends, so a run cut short keeps what it measured. After install-offline.sh:
#
#   eval "$(deploy/gpu/install-offline.sh --chunks CHUNKS --target /tmp/dgrpo-site)"
#   OUT=/path/to/results [BASELINE=.baseline-main] deploy/gpu/gang_check.sh
#   DGRPO_GANG_DRY_RUN=1 OUT=/tmp/gang-dry deploy/gpu/gang_check.sh      # the plumbing, on a CPU, tiny shapes
#
# Parts, in this order, each under its own time bound (seconds):
#   ranks      (120) bench/gang_step.py on the 0.6B shape: the one-device trainer in the worker, and a gang at 1
#              rank and at every GPU the machine has (FSDP and replicated): s/step, tokens/s, peak memory and
#              share of the base per rank. With BASELINE (today's trainer's checkout, e.g. `git archive main |
#              tar -x -C .baseline-main` beside this one, carried to the machine): this checkout's one-device
#              step against BASELINE's, alternated (the N = 1 path against today's trainer)
#   pipelined  (150) tests/gpu/test_training_run_vllm.py's pipelined run: its step against max(rollouts, train)
#   trl        (100) bench/vs_trl.py --gpu --steps 4: dgrpo's whole step against TRL's GRPOTrainer (TRL's wheels
#              pre-installed in .bench/trl, as bench/vs_trl.py says; skipped without them)
#   shapes     (the time left, at least 60) deploy/gpu/production_shapes.py: the 0.6B, 4B and 8B shapes
# Writes into $OUT: gang-output.txt (every part's output), ranks.json, one-device.json (with BASELINE),
# run_pipelined.json, vs_trl.json, shapes/shapes.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:?set OUT to the directory for the results}"
python="${PYTHON:-python3}"
dry="${DGRPO_GANG_DRY_RUN:-}"
mkdir -p "$out"
work="${DGRPO_GPU_WORK:-/tmp/dgrpo-gpu}"
mkdir -p "$work/results" "$work/pytest" "$work/logs"
export DGRPO_CACHE="$work/cache" DGRPO_GPU_RESULTS="$work/results" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)
budget=480
failed=()

part() {  # name, seconds, command...: bounded, its output appended to $OUT/gang-output.txt
    local name="$1" seconds="$2" status=ok; shift 2
    echo "== $name (at most ${seconds} s): $*" | tee -a "$out/gang-output.txt" >&2
    timeout -s INT "$seconds" "$@" >>"$out/gang-output.txt" 2>&1 || { status="FAILED ($?)"; failed+=("$name"); }
    echo "== $name: $status after $(( $(date +%s) - started )) s" | tee -a "$out/gang-output.txt" >&2
}

gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
if [ -n "$dry" ]; then
    shape=qwen3-tiny; ranks="1 2"; precision=fp32
else
    [ "$gpus" -ge 1 ] || { echo "gang_check.sh: no CUDA device (DGRPO_GANG_DRY_RUN=1 for the CPU dry run)" >&2; exit 2; }
    shape=qwen3-0.6b; ranks=$(seq -s ' ' 1 "$gpus"); precision=auto
fi

part ranks 120 "$python" bench/gang_step.py --shape "$shape" --ranks $ranks --shard fsdp replicate \
    --precision "$precision" --repeats 2 --one-device --out "$out/ranks.json"
if [ -n "${BASELINE:-}" ]; then
    part one-device 60 "$python" bench/gang_step.py --shape "$shape" --against "$BASELINE" --rounds 3 \
        --repeats 1 --out "$out/one-device.json"
fi
if [ -n "$dry" ]; then
    echo "== pipelined, trl: skipped in the dry run (vLLM and a GPU)" | tee -a "$out/gang-output.txt" >&2
else
    part pipelined 150 "$python" -m pytest -m gpu tests/gpu/test_training_run_vllm.py -k pipelined -q \
        -p no:cacheprovider --basetemp "$work/pytest/gang-pipelined"
    cp "$work/results/run_pipelined.json" "$out/" 2>/dev/null
    if [ -d .bench/trl ]; then  # TRL is no dependency: its wheels pre-installed there (bench/vs_trl.py says how)
        part trl 100 "$python" bench/vs_trl.py --gpu --steps 4
        cp bench/out/vs_trl_gpu.json "$out/vs_trl.json" 2>/dev/null
    else
        echo "== trl: skipped, no .bench/trl (TRL's wheels, pre-installed)" | tee -a "$out/gang-output.txt" >&2
    fi
fi
left=$(( budget - ($(date +%s) - started) ))
[ "$left" -ge 60 ] || left=60
if [ -n "$dry" ]; then
    part shapes "$left" "$python" deploy/gpu/production_shapes.py --device cpu --tiny --budget-s $(( left - 20 )) \
        --out "$out/shapes" --work "$work"
else
    part shapes "$left" "$python" deploy/gpu/production_shapes.py --budget-s $(( left - 20 )) --out "$out/shapes" \
        --work "$work"
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]} (see $out/gang-output.txt)" >&2
    exit 1
fi
echo "all parts passed in $(( $(date +%s) - started )) s" >&2
