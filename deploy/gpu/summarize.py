"""The GPU table of docs/gpu-results.md from a directory of GPU results (what check-on-device.sh's parts and
``bench/vs_trl.py --gpu`` wrote), so every figure there comes from a file and a command.

    python deploy/gpu/summarize.py deploy/gpu/results/h100-2026-11-25
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

MODES = ("sync", "shared", "pipelined")
PHASES = ("rollouts", "advantages", "train", "publish", "reload", "sleep", "wake_up")


def load(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_rows(directory: Path) -> list[str]:
    """Seconds per step and per phase (median of the run's steps), reward, importance ratio, per mode."""
    lines = [
        "| mode | s / step | " + " | ".join(PHASES) + " | train end → adapter served | reward, step 1 → last "
        "| mean importance ratio per step |",
        "|---|---:|" + "---:|" * len(PHASES) + "---:|---|---|",
    ]
    for mode in MODES:
        run = load(directory, f"run_{mode}")
        if run is None:
            continue
        steps = run["seconds_per_step"]
        phase = {p: median([s[p] for s in steps if s.get(p)]) for p in PHASES}
        handover = median([s.get("publish", 0) + s.get("wake_up", 0) + s.get("reload", 0) for s in steps])
        ratios = [m["mean_ratio"] for m in run["trainer"]]
        cells = [f"{phase[p]:.2f}" if phase[p] == phase[p] else "" for p in PHASES]
        rewards = run["reward_mean"]
        lines.append(
            f"| {mode} | {median([s['step'] for s in steps]):.2f} | " + " | ".join(cells)
            + f" | {handover:.2f} | {rewards[0]:.3f} → {rewards[-1]:.3f} | "
            + f"{min(ratios):.3f} – {max(ratios):.3f} |"
        )  # fmt: skip
    return lines if len(lines) > 2 else []


def pipelined_ratio(directory: Path) -> list[str]:
    """Pipelined step against max(rollouts, train), and against the trainer's serial chain."""
    pipe, sync = load(directory, "run_pipelined"), load(directory, "run_sync")
    if pipe is None or sync is None:
        return []
    steps = pipe["seconds_per_step"][1:]  # step 1 has nothing to overlap with
    step = median([s["step"] for s in steps])
    train = median([s["train"] for s in steps])
    rollouts = median([s["rollouts"] for s in sync["seconds_per_step"]])
    chain = median([s.get("advantages", 0) + s["train"] + s["publish"] + s["reload"] for s in steps])
    return [
        f"pipelined step (median of steps 2..) {step:.2f} s; max(rollouts {rollouts:.2f} s [sync run], "
        f"train {train:.2f} s) = {max(rollouts, train):.2f} s → ratio {step / max(rollouts, train):.2f}; "
        f"against the trainer's serial chain (advantages + train + publish + reload = {chain:.2f} s): "
        f"{step / chain:.2f}"
    ]


def trainer_rows(directory: Path) -> list[str]:
    lines = ["| trainer | max \\|Δ logprob\\| fp32 / bf16 autocast | step s fp32 mb8 / mb32 | "
             "bf16 mb8 / mb32 | trained tok/s (fp32 mb32) | OOM halving under a cap |",
             "|---|---|---|---|---:|---|"]  # fmt: skip
    for name in ("gpu_trainer", "gpu_trainer_unsloth"):
        r = load(directory, name)
        if r is None:
            continue
        gap, s = r["max_abs_logprob_diff"], r["step_seconds"]
        sizes = " → ".join(str(a["micro_batch"]) for a in r["oom"]["attempts"])
        lines.append(
            f"| {r['backend']} ({r['model_class']}) | {gap['fp32']:.2g} / {gap['bf16_autocast']:.2g} | "
            f"{s['fp32 mb8']:.2f} / {s['fp32 mb32']:.2f} | {s['bf16 mb8']:.2f} / {s['bf16 mb32']:.2f} | "
            f"{r['trained_tokens'] / s['fp32 mb32']:.0f} | {sizes} |"
        )
    return lines


def other_rows(directory: Path) -> list[str]:
    lines = []
    gap = load(directory, "logprob_agreement_vllm_bf16_vs_trainer_fp32")
    if gap:
        lines.append(
            f"vLLM bf16 sampling vs the trainer's fp32 forward, {gap['tokens']} tokens: mean |Δ logprob| "
            f"{gap['mean_abs']:.3f}, max {gap['max_abs']:.3f}"
        )
    sleep = load(directory, "vllm_sleep")
    if sleep:
        lines.append(
            f"vLLM /sleep freed {sleep['freed_gib']:.1f} GiB (its share: {sleep['share_gib']:.1f} GiB)"
        )
    bench = load(directory, "gpu_vllm")
    if bench:
        tok = ", ".join(f"{label} {value:,.0f} tok/s" for label, value in bench["tok_s"].items())
        swap, slept = bench.get("adapter_swap_s"), bench.get("sleep")
        lines.append(
            f"vLLM {bench['settings']['dtype']}, {bench['concurrency']} concurrent chats × {bench['max_tokens']} "
            f"tokens: {tok}; server start {bench['start_s']:.0f} s"
            + (
                f"; adapter load → first token {swap['median']:.3f} s (median of {len(swap['all'])})"
                if swap
                else ""
            )
            + (
                f"; sleep {slept['sleep_s']:.2f} s, wake-up {slept['wake_up_s']:.2f} s, "
                f"{slept['freed_gib']:.1f} GiB freed"
                if slept
                else ""
            )
        )
    trl = load(directory, "vs_trl_gpu")
    if trl:
        meds = {side: median(r["step_s"][1:]) for side, r in trl["sides"].items()}
        best = min(v for k, v in meds.items() if k.startswith("trl"))
        cells = ", ".join(f"{side} {m:.2f} s" for side, m in meds.items())
        lines.append(
            f"whole step, median of steps 2..{trl['steps']}: {cells}; dgrpo / TRL's best {meds['dgrpo'] / best:.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="a directory of GPU result JSON files")
    directory = parser.parse_args().results
    for block in (
        run_rows(directory),
        pipelined_ratio(directory),
        trainer_rows(directory),
        other_rows(directory),
    ):
        if block:
            print("\n".join(block) + "\n")


if __name__ == "__main__":
    main()
