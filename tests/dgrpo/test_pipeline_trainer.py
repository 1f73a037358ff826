"""``PipelineTrainer``'s mapping of ART's arguments onto a pipelined ``TrainingRun``, and what it refuses
with ``durable=True`` (no stack needed; tests/workflows/test_pipeline_trainer_run.py runs it)."""

from __future__ import annotations

from typing import Any

import pytest

import dgrpo as art
from dgrpo.pipeline_trainer import PipelineTrainer, make_group_rollout_fn
from examples.arithmetic import rollout, scenarios
from schemas.config import TaskQueues


def trainer(**kwargs: Any) -> PipelineTrainer:
    model = art.TrainableModel(name="agent", project="pipe", base_model="smollm2-135m-instruct")
    backend = art.TemporalBackend(address="127.0.0.1:1", task_queues=TaskQueues(control="c", inference="i"))
    args: dict[str, Any] = {
        "rollout_fn": make_group_rollout_fn(rollout, n=3),
        "scenarios": scenarios()[:10],
        "config": None,
        "durable": True,  # what a TrainingRun cannot take is refused (without it: run in this process)
    }
    args.update(kwargs)
    return PipelineTrainer(model, backend, **args)


def test_art_arguments_become_a_pipelined_run_spec() -> None:
    spec = trainer(min_batch_size=2, max_steps_off_policy=2, learning_rate=3e-5, loss_fn="ppo").run_spec()
    assert (spec.run_id, spec.mode, spec.max_staleness) == ("pipe-agent", "pipelined", 2)
    assert (spec.task.rollout, spec.group_size, spec.groups_per_step) == ("examples.arithmetic:rollout", 3, 2)
    assert spec.steps == 5  # one pass over 10 scenarios, 2 groups a step (ART stops when they run out)
    assert (spec.train.learning_rate, spec.train.importance_sampling) == (3e-5, "ppo_clip")
    assert spec.task.scenarios == scenarios()[:10]
    assert (spec.task_queues.control, spec.task_queues.inference) == ("c", "i")
    assert trainer(max_steps=7, max_batch_size=4).run_spec().steps == 7
    # One mapping of ART's training keywords for both modes: backend.train's (in this process) and the run's.
    assert spec.train.scale_rewards and not trainer(normalize_advantages=False).run_spec().train.scale_rewards


async def nested_rollout_holder() -> None:
    async def nested(model: Any, scenario: Any) -> art.Trajectory:
        return art.Trajectory()

    with pytest.raises(art.UnsupportedArtOption, match="module-level `async def`"):
        trainer(rollout_fn=make_group_rollout_fn(nested, n=2))


async def needs_config(model: Any, scenario: Any, config: Any) -> art.Trajectory:
    return art.Trajectory()


async def takes_config(model: Any, scenario: Any, config: Any = None) -> art.Trajectory:
    return art.Trajectory()


async def group_rollout(model: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
    return art.TrajectoryGroup([])


async def test_what_cannot_cross_to_a_worker_is_refused_saying_why() -> None:
    await nested_rollout_holder()
    with pytest.raises(art.UnsupportedArtOption, match="make_group_rollout_fn"):
        trainer(rollout_fn=group_rollout)
    with pytest.raises(art.UnsupportedArtOption, match=r"call needs_config\(model, scenario\)"):
        trainer(rollout_fn=make_group_rollout_fn(needs_config, n=2))
    with pytest.raises(art.UnsupportedArtOption, match="cannot pass this process's config"):
        trainer(rollout_fn=make_group_rollout_fn(takes_config, n=2), config={"turns": 3})
    assert trainer(rollout_fn=make_group_rollout_fn(takes_config, n=2)).rollout_path.endswith(":takes_config")
    with pytest.raises(art.UnsupportedArtOption, match=r"scenario 1 is a str.*dicts"):
        trainer(scenarios=[{"a": 1}, "two"])
    with pytest.raises(art.UnsupportedArtOption, match="save_checkpoint=False"):
        trainer(save_checkpoint=False)
    with pytest.raises(art.UnsupportedArtOption, match=r"kl_penalty_coef=0.1: .*no KL penalty"):
        trainer(kl_penalty_coef=0.1)
    with pytest.raises(art.UnsupportedArtOption, match="n >= 2"):
        make_group_rollout_fn(rollout, n=1)

    async def stream() -> Any:
        yield {"a": 1}

    with pytest.raises(art.UnsupportedArtOption, match="scenarios up front"):
        trainer(scenarios=stream())
