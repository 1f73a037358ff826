"""Record the Temporal histories that tests/workflows/test_replay.py replays on every change.

    PYTHONPATH=$PWD .venv/bin/python tests/workflows/histories/record.py [--out DIR] [--only sft|inline|resample]

On a private embedded stack with one real ``dgrpo worker all`` (CPU server and CPU trainer, SmolLM2-135M):
a sync ``TrainingRun`` of 3 steps that continues as new after 2, a pipelined run of 3 steps, a shared run of
2 steps, and the ART-style client (``examples/art_style.py`` through ``TemporalBackend``: ``ServeModel`` and
two ``TrainStep``s), and one ``model.train_sft`` through ``TemporalBackend`` (a ``TrainSFT``; ``--only sft``
records that one alone). ``--only resample`` records ``replay-resample``, alone: one step of one group of two on
sums far beyond the model, whose first rollouts had no learning signal and were rolled out again (a
recording may need a second try if the first draw happens to differ). ``--only beside`` records ``replay-beside``, alone: a pipelined run of 4 steps
after ``durability-beside-training`` (each step trains while the one before it publishes and reloads; 4 epochs a
step), continued as new after 3. ``--only servable`` records ``replay-servable-sync`` (3 steps, continued as new
after 2) and ``replay-servable-pipelined`` (4 steps, after 3), alone: runs after ``servable-before-resumable``
(each step's adapter published and reloaded before the rest of its checkpoint). ``--only carry`` records
``replay-carry-pipelined`` (4 steps, continued as new after 2), alone: a run after
``unsettled-step-across-continue-as-new`` (the continued run writes the rest of step 2's checkpoint beside step 3's
training). ``--only inline`` records one
more run, alone: a sync run of 2 steps whose
``task.scenarios`` is an inline list (``replay-inline``). Its recorded history predates the
``scenarios-by-reference`` patch (each rollouts activity carries the list itself), so it was recorded from the
workflow code before that patch (commit 0f3fe03, with this script copied in); recording it again from today's
code would replay the patched path only. ``--only texts`` records ``replay-texts``, alone: a sync run of 2 steps
with a chat template of its own and a RULER judge with a rubric, on a worker that trusts run templates; it was
recorded from the workflow code before the ``run-texts-by-reference`` patch (each rollouts, judge and train
activity carries the texts), for the same reason. Every execution's history, each run of a continue-as-new chain
included, is written as ``<workflow id>__<n>.json`` (Temporal's JSON history format). Record again only on
purpose: the files are what runs in flight look like, and a change that cannot replay them would break those
runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from dgrpo.client import run_control  # noqa: E402
from examples.arithmetic import scenarios  # noqa: E402
from schemas.config import RunSpec, TaskQueues  # noqa: E402
from schemas.settings import ENV_HOME  # noqa: E402
from workers.launcher import WorkerProcess  # noqa: E402
from workers.stack import EmbeddedStack  # noqa: E402
from workers.temporal import connect_client  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS: dict[str, dict[str, Any]] = {
    "replay-sync": {"mode": "sync", "steps": 3, "continue_as_new_every": 2},
    "replay-pipelined": {"mode": "pipelined", "steps": 3},
    "replay-shared": {"mode": "shared", "steps": 2},
}
INLINE_RUNS: dict[str, dict[str, Any]] = {
    "replay-inline": {
        "mode": "sync",
        "steps": 2,
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": scenarios()},
    },
}

OWN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT_RUNS: dict[str, dict[str, Any]] = {
    "replay-texts": {
        "mode": "sync",
        "steps": 2,
        "chat_template": OWN_TEMPLATE,
        "judge": {"kind": "ruler", "rubric": "Prefer the answer that is the correct sum, said briefly."},
    },
}

BESIDE_RUNS: dict[str, dict[str, Any]] = {
    # Pipelined after durability-beside-training: a step trains while the one before it publishes and reloads
    # (4 epochs: training is the longer phase); continued as new after 3 steps, carrying step 4's rollouts.
    "replay-beside": {"mode": "pipelined", "steps": 4, "continue_as_new_every": 3, "train": {"epochs": 4}},
}

SERVABLE_RUNS: dict[str, dict[str, Any]] = {
    # After servable-before-resumable: each step's adapter is published and reloaded before the rest of its
    # checkpoint, which goes up beside what follows; sync continued as new after 2 steps, pipelined after 3.
    "replay-servable-sync": {"mode": "sync", "steps": 3, "continue_as_new_every": 2},
    "replay-servable-pipelined": {"mode": "pipelined", "steps": 4, "continue_as_new_every": 3},
}

CARRY_RUNS: dict[str, dict[str, Any]] = {
    # After unsettled-step-across-continue-as-new: a pipelined run continued as new after 2 steps once step 2 was
    # served, the continued run writing the rest of step 2's checkpoint beside step 3's training.
    "replay-carry-pipelined": {"mode": "pipelined", "steps": 4, "continue_as_new_every": 2},
}

RESAMPLE_RUNS: dict[str, dict[str, Any]] = {
    # Sums far beyond the model: no reply comes within MAX_DISTANCE, so a reward is only the format's, and a
    # group of two replies often has none to tell apart; a step whose groups all have none is rolled out again.
    "replay-resample": {
        "mode": "sync",
        "steps": 1,
        "groups_per_step": 1,
        "group_size": 2,
        "task": {
            "rollout": "examples.arithmetic:rollout",
            "scenarios": [
                {
                    "id": f"huge-{i}",
                    "a": 10**9 + 7919 * i,
                    "b": 2 * 10**9 + 104729 * i,
                    "answer": 3 * 10**9 + 112648 * i,
                }
                for i in range(16)
            ],
        },
    },
}


def spec(run_id: str, queues: TaskQueues, overrides: dict[str, Any]) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    overrides = dict(overrides)
    template = overrides.pop("chat_template", None)
    data.update(run_id=run_id, task_queues=queues.model_dump(), metrics={"wandb": False}, **overrides)
    data["model"]["name"] = run_id
    if template is not None:
        data["model"]["chat_template"] = template
    data["train"] = {"learning_rate": 2e-4, **overrides.get("train", {})}
    return RunSpec.model_validate(data)


async def training_runs(runs: dict[str, dict[str, Any]]) -> None:
    client = await connect_client()
    for run_id, overrides in runs.items():
        print(f"{run_id}: {overrides}", flush=True)
        handle = await run_control.start_run(client, spec(run_id, queues=TaskQueues(), overrides=overrides))
        try:
            await run_control.watch(handle, lambda _: None, interval=1.0)
        except Exception as err:  # a run that fails (no learning signal) is a history too
            print(f"{run_id} ended: {err}", flush=True)


async def art_program(inference_url: str) -> None:
    """``examples/art_style.py`` to step 2 through ``TemporalBackend``: a ``TrainStep`` per step it trains, and
    a ``ServeModel`` when its newest checkpoint is not on the (new) server it registers with."""
    art = [sys.executable, str(REPO / "examples" / "art_style.py"), "--backend", "temporal", "--steps", "2"]
    art += ["--name", "replay-art", "--project", "replay", "--inference-url", inference_url]
    proc = await asyncio.create_subprocess_exec(*art, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if await proc.wait() != 0:
        raise SystemExit("examples/art_style.py failed")


async def sft_program(inference_url: str) -> None:
    """One ``model.train_sft`` of four chats through ``TemporalBackend``: a ``TrainSFT`` workflow."""
    import dgrpo as art

    chats = [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": f"Name a fruit ({i})."},
                {"role": "assistant", "content": "Pineapple"},
            ],
            reward=0,
        )
        for i in range(4)
    ]
    async with art.TemporalBackend(inference_url=inference_url) as backend:
        model = art.TrainableModel(name="replay-sft", project="replay", base_model="smollm2-135m-instruct")
        await model.register(backend)
        await model.train_sft(chats, art.TrainSFTConfig(learning_rate=2e-3, batch_size=2))


async def write_histories(out: Path, prefix: str = "") -> None:
    client = await connect_client()
    written = 0
    async for execution in client.list_workflows():
        if not execution.id.startswith(prefix):
            continue
        runs = [e async for e in client.list_workflows(f"WorkflowId = '{execution.id}'")]
        if execution.run_id != max(runs, key=lambda e: e.start_time).run_id:
            continue  # every run of a chain is written once, from its newest execution's listing
        for n, run in enumerate(sorted(runs, key=lambda e: e.start_time)):
            history = await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
            (out / f"{run.id}__{n}.json").write_text(history.to_json())
            written += 1
    print(f"{written} histories in {out}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument(
        "--only",
        choices=("sft", "inline", "resample", "texts", "beside", "servable", "carry"),
        help="record only the TrainSFT run, or only replay-inline, replay-resample, replay-texts, replay-beside, "
        "replay-servable-sync and -pipelined, or replay-carry-pipelined",
    )
    args = parser.parse_args()
    out = args.out
    home = Path(tempfile.mkdtemp(prefix="dgrpo-record-"))
    stack = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    stack.start()
    os.environ.update({**stack.env(), ENV_HOME: str(home)})
    try:
        if args.only:
            trust = ["--trust-request-chat-template"] if args.only == "texts" else []
            worker = WorkerProcess(
                "all", home / f"worker-{args.only}.log", task_queues=TaskQueues(), cwd=REPO, extra_args=trust
            )
            worker.start()
            try:
                if args.only == "sft":
                    asyncio.run(sft_program(worker.server_urls[0]))
                else:
                    runs = {
                        "inline": INLINE_RUNS, "resample": RESAMPLE_RUNS, "texts": TEXT_RUNS, "beside": BESIDE_RUNS,
                        "servable": SERVABLE_RUNS, "carry": CARRY_RUNS,
                    }[args.only]  # fmt: skip
                    asyncio.run(training_runs(runs))
            finally:
                worker.stop()
            prefix = {"sft": "sft-", "inline": "replay-inline", "resample": "replay-resample",
                      "texts": "replay-texts", "beside": "replay-beside", "servable": "replay-servable",
                      "carry": "replay-carry"}[args.only]  # fmt: skip
            asyncio.run(write_histories(out, prefix=prefix))
            return
        for n, phase in enumerate(("train", "serve again")):
            worker = WorkerProcess("all", home / f"worker-{n}.log", task_queues=TaskQueues(), cwd=REPO)
            worker.start()
            try:
                if phase == "train":
                    asyncio.run(training_runs(RUNS))
                print(f"art_style.py ({phase})", flush=True)
                asyncio.run(art_program(worker.server_urls[0]))
                if phase == "train":
                    asyncio.run(sft_program(worker.server_urls[0]))
            finally:
                worker.stop()  # the second worker's server starts empty: registering runs ServeModel
        asyncio.run(write_histories(out))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
