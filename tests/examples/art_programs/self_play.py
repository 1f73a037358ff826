"""A program shaped as ART's ``examples/tic_tac_toe_self_play`` (train.py, rollout.py, deploy_step.py and its
``gather_trajectory_groups_by_index``), written here in our own words: every ART call they make, made as they
make it, with one move per player so SmolLM2-135M trains two steps on a CPU.

- ``art.TrainableModel(..., config=ModelConfig(), _internal_config=art.dev.InternalModelConfig(engine_args=
  art.dev.EngineArgs(num_scheduler_steps=1)))`` (accepted with one warning), a teacher ``art.Model`` behind an
  OpenAI endpoint (``OPENAI_BASE_URL``/``OPENAI_API_KEY``) with ``config=``, both registered;
- rollouts annotated ``art.Model[ModelConfig]``, a teacher in a pydantic scenario field (``art.Model | None``),
  ``PlayerState(BaseModel)`` holding a trajectory and a ``ChatCompletion``, ``@art.retry``, the teacher's reply
  turned into guidance by ``get_guided_completion_params`` (sent as ``guided_choice`` only where the engine
  enforces it: vLLM; dgrpo's CPU server refuses it, tested apart);
- the by-index gather built from ``GatherContext``, ``set_gather_context``, ``wrap_group_awaitable`` (each
  awaitable a coroutine returning a 2-tuple of trajectories), its bar assigned after the awaitables exist;
- ``model.log(list_of_trajectories, split="val")``, ``backend.train(model, groups, learning_rate=,
  verbose=True)``, ``_experimental_pull_from_s3`` / ``_experimental_push_to_s3``;
- deploy_step.py: ``_experimental_pull_model_checkpoint(model, step=, s3_bucket=os.environ.get("BACKUP_BUCKET"),
  verbose=True)`` on an unregistered model, then ``deploy_model`` (refused when called).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Iterable

import openai
import tqdm
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

import dgrpo as art
from dgrpo.errors import UnsupportedArtFeature
from dgrpo.gather import GatherContext, set_gather_context, wrap_group_awaitable
from dgrpo.guided_completion import get_guided_completion_params
from dgrpo.local.backend import LocalBackend
from dgrpo.utils.deployment import TogetherDeploymentConfig, deploy_model
from dgrpo.utils.strip_logprobs import strip_logprobs

BASE_MODEL = "smollm2-135m-instruct"
PROJECT = "art-self-play"
NAME = "selfplay-001"
STEPS = 2
GAMES = 2
GUIDED_ENGINE = False
"""Whether the engine enforces ``guided_choice`` (vLLM does; dgrpo's CPU server refuses it with a 400)."""


class ModelConfig(BaseModel):
    requires_reasoning: bool = False


class PlayerState(BaseModel):
    trajectory: art.Trajectory
    last_completion: ChatCompletion | None = None


class TicTacToeScenario(BaseModel):
    step: int
    split: str = "train"
    x_teacher: art.Model | None = None
    o_teacher: art.Model | None = None


def score(reply: str) -> float:
    """A shaped reward: a move on the board, else partial credit by length (so a group's rewards differ)."""
    squares = [f"{r}{c}" for r in "ABC" for c in "123"]
    return 1.0 if any(s in reply for s in squares) else min(len(reply), 40) / 100


async def move(
    model: art.Model[ModelConfig], teacher: art.Model[ModelConfig] | None, player: PlayerState, seed: int
) -> None:
    player.trajectory.messages_and_choices.append(
        {"role": "user", "content": "Board:\n_|_|_\n_|_|_\n_|_|_\nYour move, as a square like B2."}
    )
    guided_choice = None
    if teacher is not None:
        reasoning = teacher.config is not None and teacher.config.requires_reasoning
        teacher_completion = await teacher.openai_client().chat.completions.create(
            model=teacher.get_inference_name(),
            messages=player.trajectory.messages(),
            max_completion_tokens=16,
            reasoning_effort="low" if reasoning else None,  # type: ignore[arg-type]
            temperature=1.0,
        )
        guided_choice, _, _ = get_guided_completion_params(teacher_completion)
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=player.trajectory.messages(),
        max_completion_tokens=8,
        seed=seed,
        extra_body={"guided_choice": guided_choice}
        if guided_choice and model.trainable and GUIDED_ENGINE
        else None,
    )
    player.last_completion = completion
    choice = completion.choices[0]
    player.trajectory.messages_and_choices.append(choice)
    player.trajectory.reward = score(choice.message.content or "")


@art.retry(exceptions=(openai.LengthFinishReasonError,))
async def rollout(
    x_model: art.Model[ModelConfig],
    o_model: art.Model[ModelConfig],
    scenario: TicTacToeScenario,
    game: int = 0,
) -> tuple[art.Trajectory, art.Trajectory]:
    x = PlayerState(
        trajectory=art.Trajectory(messages_and_choices=[], reward=0, metadata={"model_name": x_model.name})
    )
    o = PlayerState(
        trajectory=art.Trajectory(messages_and_choices=[], reward=0, metadata={"model_name": o_model.name})
    )
    await move(x_model, scenario.x_teacher, x, seed=scenario.step * 100 + game * 2)
    await move(o_model, scenario.o_teacher, o, seed=scenario.step * 100 + game * 2 + 1)
    return x.trajectory, o.trajectory


async def gather_trajectory_groups_by_index(
    grouped_trajectory_awaitables: Iterable[Awaitable[tuple[art.Trajectory, ...]]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    trajectories_per_rollout: int = 1,
) -> list[art.TrajectoryGroup]:
    """The example's helper, in our words: each awaitable's i-th trajectory goes to group i."""
    awaitables = list(grouped_trajectory_awaitables)
    context = GatherContext(pbar=None, max_exceptions=max_exceptions)
    with set_gather_context(context):
        future = asyncio.gather(*[wrap_group_awaitable(g) for g in awaitables])
        total = sum(getattr(g, "_num_trajectories", 1) for g in awaitables) * trajectories_per_rollout
        context.pbar = tqdm.tqdm(desc=pbar_desc, total=total)
        tuples = await future
    if context.pbar is not None:
        context.pbar.close()
    by_index: list[list[art.Trajectory]] = [[] for _ in range(len(tuples[0]))]
    for trajectories in tuples:
        for i, trajectory in enumerate(trajectories):
            by_index[i].append(trajectory)
    return [art.TrajectoryGroup(trajectories) for trajectories in by_index]


async def train(
    home: str, pull_from_s3: bool = True
) -> tuple[art.TrainableModel, list[list[art.TrajectoryGroup]]]:
    """train.py: STEPS self-play steps (a teacher for some games); returns the model and each step's groups."""
    assert strip_logprobs({"logprobs": [1]}) is not None  # weave's postprocess hook in ART's program
    backend = LocalBackend(path=home)
    model = art.TrainableModel(
        name=NAME,
        project=PROJECT,
        base_model=BASE_MODEL,
        config=ModelConfig(),
        _internal_config=art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(num_scheduler_steps=1)),  # type: ignore[typeddict-unknown-key]
    )
    o4_mini = art.Model(
        name="o4-mini",
        project=PROJECT,
        inference_model_name="o4-mini",
        inference_api_key=os.environ["OPENAI_API_KEY"],
        inference_base_url=os.environ["OPENAI_BASE_URL"],
        config=ModelConfig(requires_reasoning=True),
    )
    if pull_from_s3:
        await backend._experimental_pull_from_s3(model)
    await model.register(backend)
    await o4_mini.register(backend)
    trained = []
    for i in range(await model.get_step(), STEPS):
        x_group, o_group = await gather_trajectory_groups_by_index(
            [
                rollout(
                    x_model=model,
                    o_model=model,
                    scenario=TicTacToeScenario(step=i, x_teacher=o4_mini if j % 2 == 0 else None),
                    game=j,
                )
                for j in range(GAMES)
            ],
            pbar_desc="gather",
            trajectories_per_rollout=2,
        )
        if i % 4 == 0:
            x_val, o_val = await gather_trajectory_groups_by_index(
                [
                    rollout(
                        x_model=o4_mini if j % 2 == 0 else model,
                        o_model=model if j % 2 == 0 else o4_mini,
                        scenario=TicTacToeScenario(step=i, split="val"),
                        game=j,
                    )
                    for j in range(2)
                ],
                pbar_desc="val",
                trajectories_per_rollout=2,
            )
            model_trajectories = [
                t for t in x_val.trajectories + o_val.trajectories if t.metadata["model_name"] == model.name
            ]
            await model.log(model_trajectories, split="val")
        trajectory_groups = [x_group, o_group]
        result = await backend.train(model, trajectory_groups, learning_rate=1e-4, verbose=True)
        await model.log(trajectory_groups, metrics=result.metrics, step=result.step, split="train")
        await backend._experimental_push_to_s3(model)
        trained.append(trajectory_groups)
    return model, trained


async def deploy_step(home: str, step: int) -> str:
    """deploy_step.py: the checkpoint of an unregistered model pulled to a local directory, then deployed."""
    backend = LocalBackend(path=home)
    model = art.TrainableModel(name=NAME, project=PROJECT, base_model=BASE_MODEL)
    checkpoint_path = await backend._experimental_pull_model_checkpoint(
        model, step=step, s3_bucket=os.environ.get("BACKUP_BUCKET"), verbose=True
    )
    try:
        await deploy_model(
            model=model,
            checkpoint_path=checkpoint_path,
            step=step,
            provider="together",
            config=TogetherDeploymentConfig(
                s3_bucket=os.environ.get("BACKUP_BUCKET"), wait_for_completion=True
            ),
            verbose=True,
        )
    except UnsupportedArtFeature as refused:
        print(f"not deployed: {refused}")
    return checkpoint_path
