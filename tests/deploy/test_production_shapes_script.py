"""deploy/gpu/production_shapes.py without a GPU: its plan (what a lent GPU would run, in which order, and how
long each task is expected to take) and the docs' tables from a results file (the CPU dry run's, kept in the repo).
The dry run itself (``--device cpu --tiny``: the trainer, vLLM's CPU build and two TrainingRuns on the tiny
Qwen3) takes ~10 minutes here, so it is run by hand, not in CI (docs/production-shapes.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "gpu" / "production_shapes.py"
DRY_RUN = REPO / "deploy" / "gpu" / "results" / "2026-11-27-shapes-cpu-dry-run"


def script(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_plan_runs_each_shapes_trainer_before_the_costly_tasks_and_runs_nothing() -> None:
    plan = [line.split(":")[0].split() for line in script("--plan").splitlines()]
    assert plan == [
        ["trainer", "qwen3-0.6b"], ["vllm", "qwen3-0.6b"], ["trainer", "qwen3-4b"], ["trainer", "qwen3-8b"],
        ["runs", "the", "largest", "that", "fits,", "at", "most", "qwen3-8b"], ["vllm", "qwen3-4b"],
        ["vllm", "qwen3-8b"],
    ]  # fmt: skip
    tiny = script("--plan", "--tasks", "trainer", "--tiny").splitlines()
    assert [line.split(":")[0].split() for line in tiny] == [["trainer", "qwen3-tiny"]]


def test_the_tables_show_every_figure_of_a_results_file_and_say_the_weights_were_random() -> None:
    data = json.loads((DRY_RUN / "shapes.json").read_text())
    text = script("--table", str(DRY_RUN))
    assert "random weights" in text.splitlines()[0]
    trainer = data["shapes"]["qwen3-tiny"]["trainer"]
    vllm = data["shapes"]["qwen3-tiny"]["vllm"]
    (trainer_row,) = [line for line in text.splitlines() if line.startswith("| qwen3-tiny | 3.3 M")]
    assert (
        f"{trainer['step']['tokens_per_s']:,.0f} ({trainer['step']['trained_tokens_per_s']:,.0f})"
        in trainer_row
    )
    chain = " → ".join(
        f"{a['micro_batch']} {'OOM' if a['oom'] else 'ran'}" for a in trainer["oom"]["attempts"]
    )
    assert chain in trainer_row and f"{trainer['adapter']['publish_s']:.2f}" in trainer_row
    (vllm_row,) = [
        line for line in text.splitlines() if line.startswith("| qwen3-tiny |") and line != trainer_row
    ]
    assert f"| {vllm['start_s']:.0f} | {vllm['tok_s']['base']:,.0f} |" in vllm_row
    ratio = data["runs"]["pipelined_over_max_r_t"]["ratio"]
    assert any(
        line.startswith("| pipelined, 3 steps") and f"= {ratio:.2f} |" in line for line in text.splitlines()
    )
