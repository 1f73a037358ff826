"""Learning per step: durable-grpo's demo run vs a bare in-process GRPO loop, same settings, several seeds.

Both sides train SmolLM2-135M-Instruct with a fresh LoRA (r16/a32, all linear projections) on the demo's
arithmetic task (examples/arithmetic.py: its prompt, its reward), lr 2e-4, AdamW, gradient norm clipped at 1,
4 prompts x 8 completions a step (the same scenarios per step and seed), 16 new tokens, temperature 1,
one optimizer step per step, advantages ``(r - mean) / (std + 1e-6)`` per group (population std; groups
without reward variance left out), the loss a mean over the step's completion tokens.

- ``dgrpo``: ``TrainingRun`` with examples/run.toml on a private embedded stack and one ``dgrpo worker all``
  process, as ``dgrpo demo`` runs it (sampling on our CPU server over HTTP, training in the trainer activity).
- ``bare``: one Python loop, no server, no Temporal, no storage: HF ``generate`` samples the 32 completions,
  the same model then takes one policy-gradient step ``-mean_t(A * exp(lp_t - sg(lp_t)))`` (on-policy: the
  clipped PPO ratio is 1, so this is GRPO's gradient).

Reported: each side's mean reward per step (the samples that step trains on) averaged over seeds, its
spread over seeds, and the gain (mean of the last 3 steps minus step 1). With ``--sampling-check K``, also
the base model's mean reward over all 81 scenarios x K samples from each side's sampler (our engine, as the
server runs it, and HF ``generate``), to tell a sampling difference from noise at step 1.

    PYTHONPATH=$PWD python bench/learning_parity.py [--steps 8] [--seeds 0,1,2] [--sides dgrpo,bare]
        [--sampling-check 4]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
import uuid
from typing import Any

GROUPS = 4
GROUP_SIZE = 8
LEARNING_RATE = 2e-4
MAX_GRAD_NORM = 1.0
SIDES = ("dgrpo", "bare")


# --- bare loop ----------------------------------------------------------------------------------------


def group_advantages(rewards: list[float]) -> list[float] | None:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std <= 1e-9:
        return None
    return [(r - mean) / (std + 1e-6) for r in rewards]


def hf_sample(model: Any, tok: Any, texts: list[str]) -> tuple[Any, Any]:
    """HF ``generate`` on left-padded ``texts``: temperature 1, the full distribution, ``MAX_TOKENS`` new
    tokens; returns the tokenized batch and the output ids (prompt columns first)."""
    import torch

    from examples.arithmetic import MAX_TOKENS

    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=MAX_TOKENS,
            pad_token_id=tok.pad_token_id,
        )
    return batch, out


def bare_side(steps: int, seed: int) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from activities.rollouts import pick_scenarios
    from base_models.resolve import resolve_base_model
    from examples.arithmetic import prompt, scenarios, score_answer

    torch.manual_seed(seed)
    path = resolve_base_model("smollm2-135m-instruct").base_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0)
    pool = scenarios()
    rewards_per_step: list[float] = []
    step_s: list[float] = []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        picked = [pool[i] for i in pick_scenarios(len(pool), GROUPS, (step - 1) * GROUPS, seed)]
        texts = [
            str(tok.apply_chat_template(prompt(s), add_generation_prompt=True, tokenize=False))
            for s in picked
            for _ in range(GROUP_SIZE)
        ]
        model.eval()
        batch, out = hf_sample(model, tok, texts)
        completions = out[:, batch["input_ids"].shape[1] :]
        # Completion tokens up to and including the first end-of-sequence token are trained.
        is_end = completions == tok.eos_token_id
        after_end = (is_end.cumsum(dim=1) - is_end.long()) > 0
        trained = ~after_end
        replies = [
            str(tok.decode(c[m], skip_special_tokens=True)) for c, m in zip(completions, trained, strict=True)
        ]
        rewards = [
            score_answer(reply, int(s["answer"])).reward
            for reply, s in zip(replies, [s for s in picked for _ in range(GROUP_SIZE)], strict=True)
        ]
        rewards_per_step.append(sum(rewards) / len(rewards))
        advantages: list[float] = []
        kept: list[bool] = []
        for g in range(GROUPS):
            group = group_advantages(rewards[g * GROUP_SIZE : (g + 1) * GROUP_SIZE])
            advantages += group if group is not None else [0.0] * GROUP_SIZE
            kept += [group is not None] * GROUP_SIZE
        keep = torch.tensor(kept)
        if keep.any():
            model.train()
            ids = out[keep]
            attn = torch.cat([batch["attention_mask"][keep], trained[keep].long()], dim=1)
            mask = torch.cat([torch.zeros_like(batch["attention_mask"][keep]), trained[keep].long()], dim=1)
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            lp = torch.gather(logits, -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
            weight = mask[:, 1:].float()
            adv = torch.tensor(advantages)[keep].unsqueeze(-1)
            loss = -(adv * torch.exp(lp - lp.detach()) * weight).sum() / weight.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            optimizer.step()
        step_s.append(time.perf_counter() - started)
        print(f"  bare seed {seed} step {step}: reward {rewards_per_step[-1]:.3f}", flush=True)
    return {"rewards": rewards_per_step, "step_s": step_s}


# --- dgrpo side ---------------------------------------------------------------------------------------


async def dgrpo_runs(steps: int, seeds: list[int]) -> dict[int, dict[str, Any]]:
    from bench.bench_stack import demo_run_spec, private_stack, timed_run
    from schemas.config import TaskQueues
    from workers.launcher import WorkerProcess
    from workers.temporal import connect_client

    results: dict[int, dict[str, Any]] = {}
    with private_stack() as (_stack, home):
        tag = uuid.uuid4().hex[:6]
        queues = TaskQueues(
            control=f"lp-control-{tag}", inference=f"lp-inference-{tag}", trainer=f"lp-trainer-{tag}"
        )
        worker = WorkerProcess("all", home / "logs" / "learning-parity-workers.log", task_queues=queues)
        worker.start()
        try:
            client = await connect_client(wait_s=120)
            for seed in seeds:
                spec = demo_run_spec(f"parity-{tag}-{seed}", steps, queues, seed=seed, **{"train.seed": seed})
                run = await timed_run(client, spec)
                assert run.status is not None
                by_step = {h.step: h for h in run.status.history if h.step >= 1}
                rewards = [by_step[n].reward_mean for n in sorted(by_step)]
                print(f"  dgrpo seed {seed}: rewards {[round(r or 0, 3) for r in rewards]}", flush=True)
                results[seed] = {
                    "rewards": rewards,
                    "resampled": [by_step[n].resampled for n in sorted(by_step)],
                    "step_s": list(run.step_seconds().values()),
                }
        finally:
            worker.stop()
    return results


# --- the two samplers on the base model ----------------------------------------------------------------


def sampling_check(per_scenario: int) -> dict[str, list[float]]:
    """Rewards of ``per_scenario`` base-model samples of every scenario from our engine and from HF
    ``generate`` (temperature 1, 16 tokens, the same prompt tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from base_models.resolve import resolve_base_model
    from examples.arithmetic import MAX_TOKENS, prompt, scenarios, score_answer
    from serving.batcher import GenerationEngine, GenerationRequest
    from serving.sampling import SamplingParams

    path = resolve_base_model("smollm2-135m-instruct").base_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    pool = scenarios()
    texts = [
        str(tok.apply_chat_template(prompt(s), add_generation_prompt=True, tokenize=False)) for s in pool
    ]
    answers = [int(s["answer"]) for s in pool for _ in range(per_scenario)]
    engine = GenerationEngine(path, max_batch=32)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    requests = [
        GenerationRequest(list(tok(t, add_special_tokens=False)["input_ids"]), None, params)
        for t in texts
        for _ in range(per_scenario)
    ]
    ours = [
        score_answer(f.result().text, a).reward for f, a in zip(engine.submit(requests), answers, strict=True)
    ]
    engine.close()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf: list[float] = []
    rows = [t for t in texts for _ in range(per_scenario)]
    for start in range(0, len(rows), 32):
        batch, out = hf_sample(model, tok, rows[start : start + 32])
        for row, answer in zip(
            out[:, batch["input_ids"].shape[1] :], answers[start : start + 32], strict=True
        ):
            hf.append(score_answer(str(tok.decode(row, skip_special_tokens=True)), answer).reward)
    return {"dgrpo engine": ours, "HF generate": hf}


# --- report -------------------------------------------------------------------------------------------


def gain(curve: list[float]) -> float:
    return sum(curve[-3:]) / len(curve[-3:]) - curve[0]


def report(results: dict[str, Any], steps: int) -> str:
    from bench.bench_stack import command_line

    sides = list(results["sides"])
    seeds = results["seeds"]
    lines = [
        f"Mean reward per step over seeds {seeds} (arithmetic demo task, 4 x 8, 16 tokens, LoRA r16, lr 2e-4)",
        "",
        "| step | " + " | ".join(f"{s} mean (min-max)" for s in sides) + " |",
        "|---|" + "---:|" * len(sides),
    ]
    for i in range(steps):
        cells = []
        for side in sides:
            values = [results["sides"][side][str(seed)]["rewards"][i] for seed in seeds]
            cells.append(f"{statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", "Gain (mean of the last 3 steps minus step 1), per seed and mean:", ""]
    lines += [
        "| side | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
        "|---|" + "---:|" * (len(seeds) + 1),
    ]
    for side in sides:
        gains = [gain(results["sides"][side][str(seed)]["rewards"]) for seed in seeds]
        lines.append(
            f"| {side} | " + " | ".join(f"{g:+.3f}" for g in gains) + f" | {statistics.fmean(gains):+.3f} |"
        )
    if "sampling" in results:
        lines += ["", "Base model, every scenario sampled by each side's sampler:", ""]
        lines += ["| sampler | samples | mean reward | standard error |", "|---|---:|---:|---:|"]
        for name, rewards in results["sampling"].items():
            sem = statistics.stdev(rewards) / math.sqrt(len(rewards))
            lines.append(f"| {name} | {len(rewards)} | {statistics.fmean(rewards):.3f} | {sem:.3f} |")
    lines += ["", f"command: {command_line()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--sampling-check", type=int, default=0, metavar="K", help="samples per scenario")
    args = parser.parse_args()
    from bench.bench_stack import command_line, write_results

    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, Any] = {"steps": args.steps, "seeds": seeds, "command": command_line(), "sides": {}}
    for side in args.sides.split(","):
        print(f"{side}: {args.steps} steps x seeds {seeds} ...", flush=True)
        if side == "dgrpo":
            runs = asyncio.run(dgrpo_runs(args.steps, seeds))
        else:
            runs = {seed: bare_side(args.steps, seed) for seed in seeds}
        results["sides"][side] = {str(seed): run for seed, run in runs.items()}
    if args.sampling_check:
        print(f"sampling check: 81 scenarios x {args.sampling_check} per sampler ...", flush=True)
        results["sampling"] = sampling_check(args.sampling_check)
    write_results("learning_parity", results, report(results, args.steps))


if __name__ == "__main__":
    main()
