"""docs/production-shapes.md's tables from one ``shapes.json`` (deploy/gpu/production_shapes.py's results), so
every figure there comes from a file and the command that wrote it."""

from __future__ import annotations

import statistics
from typing import Any

TRAINER_HEADER = (
    "| shape (random weights) | parameters | precision | planned micro-batch, checkpointing | tokens/s "
    "(trained tokens/s) | peak GiB | OOM halving: micro-batch → | plan would take | adapter MiB | publish s |"
)
VLLM_HEADER = "| shape (random weights) | vLLM start s | tok/s base | tok/s base / trained / other | tok/s trained | reload s (download + load → first token) |"


def _cell(value: Any, spec: str = "") -> str:
    return "" if value is None else format(value, spec)


def _parameters(count: int | None) -> str:
    if count is None:
        return ""
    return f"{count / 1e9:.2f} B" if count >= 1e8 else f"{count / 1e6:.1f} M"


def trainer_row(name: str, shape: dict[str, Any]) -> str:
    model, t = shape.get("model", {}), shape.get("trainer", {})
    plan, step, oom, adapter = t.get("plan", {}), t.get("step", {}), t.get("oom", {}), t.get("adapter", {})
    chain = " → ".join(f"{a['micro_batch']} {'OOM' if a['oom'] else 'ran'}" for a in oom.get("attempts", []))
    would = oom.get("plan_would_take", {})
    cells = [
        name,
        _parameters(model.get("parameters")),
        t.get("precision", ""),
        f"{plan['micro_batch']}, {'on' if plan['gradient_checkpointing'] else 'off'}" if plan else "",
        f"{step['tokens_per_s']:,.0f} ({step['trained_tokens_per_s']:,.0f})" if step else "",
        _cell(step.get("peak_gib"), ".1f"),
        f"from {oom.get('start')} × {oom.get('tokens_per_sequence')} tokens: {chain}" if chain else "",
        f"{would['micro_batch']}, {'on' if would['gradient_checkpointing'] else 'off'}" if would else "",
        _cell(adapter.get("adapter_mib"), ".1f"),
        _cell(adapter.get("publish_s"), ".2f"),
    ]
    return "| " + " | ".join(cells) + " |"


def vllm_row(name: str, shape: dict[str, Any]) -> str:
    v = shape.get("vllm", {})
    tok, reload = v.get("tok_s", {}), v.get("reload", {})
    cells = [
        name,
        _cell(v.get("start_s"), ".0f"),
        _cell(tok.get("base"), ",.0f"),
        _cell(tok.get("base/trained/other"), ",.0f"),
        _cell(tok.get("trained"), ",.0f"),
        f"{reload['total_s']:.2f} ({reload['download_s']:.2f} + {reload['load_to_first_token_s']:.2f})"
        if reload
        else "",
    ]
    return "| " + " | ".join(cells) + " |"


RUNS_HEADER = (
    "| runs (largest shape that fits, random weights) | s per step | rollouts s | train s | publish + reload s "
    "| sleep + wake-up s | pipelined step / max(R, T) |"
)


def _median(steps: list[dict[str, Any]], *phases: str) -> str:
    values = [
        sum(s["seconds"].get(p, 0.0) for p in phases) for s in steps if any(p in s["seconds"] for p in phases)
    ]
    return f"{statistics.median(values):.1f}" if values else ""


def runs_rows(runs: dict[str, Any]) -> list[str]:
    """Medians over each run's steps (a pipelined run's rollouts overlap the step before: not a phase of it)."""
    rows = []
    ratio = runs.get("pipelined_over_max_r_t")
    for mode in ("shared", "pipelined"):
        run = runs.get(mode)
        if not run:
            continue
        steps = run["steps"]
        cells = [
            f"{mode}, {len(steps)} steps at {runs.get('shape')}",
            " / ".join(f"{s['seconds'].get('step', 0):.1f}" for s in steps),
            _median(steps, "rollouts", "judge"),
            _median(steps, "train"),
            _median(steps, "publish", "reload"),
            _median(steps, "sleep", "wake_up"),
            f"{ratio['pipelined_step_s']:.1f} / max({ratio['rollouts_s']:.1f}, {ratio['train_s']:.1f}) = "
            f"{ratio['ratio']:.2f}"
            if mode == "pipelined" and ratio
            else "",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def table(data: dict[str, Any]) -> str:
    shapes = data.get("shapes", {})
    blocks = [
        f"{data.get('device')}, torch {data.get('torch')}, {data.get('started', '')[:10]}: {data.get('weights')}",
        "\n".join([TRAINER_HEADER, "|---|" + "---|" * 9, *(trainer_row(n, s) for n, s in shapes.items())]),
        "\n".join(
            [VLLM_HEADER, "|---|" + "---:|" * 5, *(vllm_row(n, s) for n, s in shapes.items() if "vllm" in s)]
        ),
        "\n".join([RUNS_HEADER, "|---|" + "---:|" * 6, *runs_rows(data.get("runs", {}))])
        if data.get("runs", {}).get("shared") or data.get("runs", {}).get("pipelined")
        else "",
        "\n".join(f"- skipped {s['task']}: {s['why']}" for s in data.get("skipped", [])),
        "\n".join(f"- failed {e['task']}: {e['why'].splitlines()[-1]}" for e in data.get("errors", [])),
    ]
    return "\n\n".join(block for block in blocks if block)
