"""``PipelineTrainer``'s ART 0.5.23 keywords: ``pipeline=PipelineRuntimeConfig(...)`` (or the deprecated direct
sizes, never both), ``autotune=`` (off only), ``limit_mean_steps_off_policy`` (honoured in this process,
refused by a ``TrainingRun``), ``kl_penalty_coef``/``kl_penalty_step_lag`` and the keywords accepted only at
None. No stack: the in-process loop's training goes to ``StepBackend`` (the ``backend.train`` seam)."""

from __future__ import annotations

import asyncio
import logging
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

import dgrpo as art
from tests.dgrpo.test_pipeline_trainer import trainer
from tests.dgrpo.test_pipeline_trainer_in_process import StepBackend, group, in_process


def test_the_runtime_config_checks_its_sizes() -> None:
    assert art.PipelineRuntimeConfig().min_batch_size == 4
    with pytest.raises(ValidationError, match="max_batch_size must be >= min_batch_size"):
        art.PipelineRuntimeConfig(min_batch_size=3, max_batch_size=2)
    with pytest.raises(ValidationError, match="num_rollout_workers"):
        art.PipelineRuntimeConfig(num_rollout_workers=0)
    with pytest.raises(ValidationError, match="extra"):
        art.PipelineRuntimeConfig(batch=3)  # type: ignore[call-arg]


def test_pipeline_sizes_reach_the_run_and_the_direct_keywords_still_do_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config form warns about nothing
        spec = trainer(pipeline=art.PipelineRuntimeConfig(min_batch_size=2, num_rollout_workers=3)).run_spec()
    # 3 scenarios at once, 3 rollouts each
    assert (spec.groups_per_step, spec.task.rollout_concurrency) == (2, 9)
    with pytest.warns(
        DeprecationWarning,
        match=r"min_batch_size=\.\.\., num_rollout_workers=\.\.\.\) is deprecated.*PipelineRuntimeConfig",
    ):
        direct = trainer(min_batch_size=2, num_rollout_workers=3).run_spec()
    assert (direct.groups_per_step, direct.task.rollout_concurrency) == (2, 9)
    with pytest.raises(ValueError, match="either pipeline=PipelineRuntimeConfig"):
        trainer(pipeline=art.PipelineRuntimeConfig(), max_batch_size=4)


def test_only_autotune_off_trains() -> None:
    off = art.PipelineAutotuneConfig(mode="off", window_steps=8)  # the tuner's own fields are kept as given
    assert trainer(autotune=off).run_spec().groups_per_step == 4
    with pytest.raises(art.UnsupportedArtOption, match=r"mode='online'.*changes the batch sizes"):
        trainer(autotune=art.PipelineAutotuneConfig(mode="online"))


def test_new_training_keywords_are_checked_accepted_or_refused() -> None:
    assert trainer(kl_penalty_step_lag=2, optimizer_save_interval=1, adam_params=None).run_spec()
    with pytest.raises(ValueError, match="kl_penalty_step_lag must be >= 1"):
        trainer(kl_penalty_step_lag=0)
    with pytest.raises(ValueError, match="optimizer_save_interval must be > 0"):
        trainer(optimizer_save_interval=0)
    with pytest.raises(
        art.UnsupportedArtOption, match=r"grad_accumulation_sequences=\.\.\.\).*leave it None"
    ):
        trainer(grad_accumulation_sequences=4)
    with pytest.raises(art.UnsupportedArtOption, match="no KL penalty"):
        trainer(kl_penalty_coef=0.05, kl_penalty_step_lag=1)
    assert trainer(score_reference_groups_per_step=4.0, total_scenarios=10).run_spec()


def test_a_mean_off_policy_limit_runs_in_this_process(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(art.UnsupportedArtOption, match=r"limit_mean_steps_off_policy=1\.5: a TrainingRun"):
        trainer(limit_mean_steps_off_policy=1.5)
    with caplog.at_level(logging.WARNING):
        here = trainer(limit_mean_steps_off_policy=1.5, durable=None)
    assert not here.durable and "limit_mean_steps_off_policy" in caplog.text
    with pytest.raises(ValueError, match="limit_mean_steps_off_policy must be >= 0"):
        trainer(limit_mean_steps_off_policy=-1, durable=None)


async def test_groups_older_on_average_than_the_limit_are_dropped(tmp_path: Path) -> None:
    backend = StepBackend()
    loop = in_process(
        tmp_path, backend, lambda *_: asyncio.sleep(0), [], pipeline=art.PipelineRuntimeConfig(min_batch_size=1,
        max_batch_size=3), max_steps_off_policy=3, limit_mean_steps_off_policy=1.0, max_steps=1,
    )  # fmt: skip

    def mixed(versions: list[int]) -> art.TrajectoryGroup:
        built = group([0.0, 1.0, 0.5])
        for trajectory, version in zip(built.trajectories, versions, strict=True):
            trajectory.initial_policy_version = version
        return built

    # At step 3: mean ages 0.67, 1.33 (over the limit, though no rollout is more than 3 behind) and 1.0.
    recent, older, old = mixed([3, 3, 1]), mixed([1, 1, 3]), mixed([1, 2, 3])
    queue: asyncio.Queue[art.TrajectoryGroup | None] = asyncio.Queue()
    loop._output_queue = queue
    for g in (recent, older, old, None):
        queue.put_nowait(g)
    loop.state.next_training_step = loop.state.policy_version = 3

    await loop._training_stage()

    assert backend.batches == [[recent, old]]
    assert loop.state.discarded_stale_groups == 1
