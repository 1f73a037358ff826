"""ART's seam between a model and its backend: ``model.get_step`` (and so ``model.log``'s default step) asks
``backend._get_step(model)``, ``model.train_sft`` iterates ``backend._train_sft(...)``, averaging its
batches into one ``train`` row at the step the backend reports afterwards, and ``backend.train`` likewise
averages ``backend._train_model(...)``'s rows into its result.

``StepsBackend`` is a backend of the test's own at that seam (as ART's own backends are); dgrpo's
``LocalBackend`` fills it in tests/dgrpo/test_art_sft.py, on the real stack. What dgrpo's backends yield
for a ``TrainSFT`` result is ``dgrpo.client.sft.batch_metrics``, checked here on a result of the workflow's shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import dgrpo as art
from dgrpo.client.sft import batch_metrics, result_metrics
from dgrpo.errors import UnsupportedArtOption
from dgrpo.local import LocalBackend
from schemas.activities import SftResult
from schemas.config import TrainConfig
from schemas.refs import CheckpointRef
from schemas.run_state import TrainSFTResult


class StepsBackend:
    """ART's ``_get_step`` and ``_train_sft``: a step it keeps, and the batches it is told to yield."""

    def __init__(self, step: int, batches: list[dict[str, float]]) -> None:
        self.step = step
        self.batches = batches
        self.asked_step = 0
        self.calls: list[tuple[list[art.Trajectory], art.TrainSFTConfig, Mapping[str, Any], bool]] = []

    async def _get_step(self, model: art.TrainableModel) -> int:
        self.asked_step += 1
        return self.step

    async def _train_sft(
        self,
        model: art.TrainableModel,
        trajectories: Iterable[art.Trajectory],
        config: art.TrainSFTConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        self.calls.append((list(trajectories), config, dev_config, verbose))
        for batch in self.batches:
            yield batch
        self.step += 1 if self.batches else 0


def model_on(backend: StepsBackend, tmp_path: Path) -> art.TrainableModel:
    model = art.TrainableModel(
        name="seam", project="own", base_model="m", base_path=str(tmp_path), report_metrics=[]
    )
    model._backend = backend  # type: ignore[assignment]  # ART's way of giving a model a backend object
    return model


def history(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "own/models/seam/history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def chats(n: int) -> list[art.Trajectory]:
    return [
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
        )
        for i in range(n)
    ]


async def test_get_step_and_log_follow_the_backends_step(tmp_path: Path) -> None:
    backend = StepsBackend(step=7, batches=[])
    model = model_on(backend, tmp_path)
    assert await model.get_step() == 7
    await model.log([art.TrajectoryGroup(chats(2))], split="train")
    assert (tmp_path / "own/models/seam/trajectories/train/0007.parquet").exists()
    assert [row["step"] for row in history(tmp_path)] == [7]


async def test_train_sft_logs_the_backends_batches_as_one_row_at_its_new_step(tmp_path: Path) -> None:
    batches = [
        {"loss/train": 1.0, "loss/grad_norm": 0.5, "data/step_num_gradient_steps": 3.0},
        {"loss/train": 0.5, "loss/grad_norm": 0.25, "data/step_num_gradient_steps": 3.0},
        {
            "loss/train": 0.0,
            "loss/grad_norm": 0.0,
            "data/step_num_gradient_steps": 3.0,
            "time/step_trainer_s": 9.0,
        },
    ]
    backend = StepsBackend(step=4, batches=batches)
    model = model_on(backend, tmp_path)
    result = await model.train_sft(chats(5))

    [(trained, config, dev_config, verbose)] = backend.calls
    assert len(trained) == 5 and config == art.TrainSFTConfig() and dev_config == {} and not verbose
    assert result is not None and result.step == 5
    assert result.metrics == {
        "loss/train": 0.5,
        "loss/grad_norm": 0.25,
        "data/step_num_gradient_steps": 3.0,
        "time/step_trainer_s": 9.0,  # the backend's own time is kept
    }
    [row] = history(tmp_path)
    assert row["step"] == 5 and row["loss/train"] == 0.5 and row["time/step_trainer_s"] == 9.0


async def test_train_sft_times_a_backend_that_does_not(tmp_path: Path) -> None:
    model = model_on(StepsBackend(step=0, batches=[{"loss/train": 2.0}]), tmp_path)
    result = await model.train_sft(chats(1), art.TrainSFTConfig(learning_rate=1e-4))
    assert result is not None and result.step == 1 and result.metrics["time/step_trainer_s"] >= 0
    [row] = history(tmp_path)
    assert row["time/step_trainer_s"] >= 0 and row["time/cum/trainer_s"] >= 0


async def test_train_sft_with_no_batches_logs_nothing_and_asks_no_step(tmp_path: Path) -> None:
    backend = StepsBackend(step=3, batches=[])
    assert await model_on(backend, tmp_path).train_sft([]) is None
    assert backend.asked_step == 0 and history(tmp_path) == []


def sft_result(losses: list[float], rates: list[float], norms: list[float], seconds: float) -> TrainSFTResult:
    trained = SftResult(
        run_id="own-seam", step=2, staging_dir="/tmp/x", worker_id="w", n_trainable_tokens=40,
        n_dropped_overlength=1, micro_batch_size=2, seconds=seconds, losses=losses, grad_norms=norms,
        learning_rates=rates, n_examples=5,
    )  # fmt: skip
    checkpoint = CheckpointRef(
        run_id="own-seam", step=2, uri="s3://b/runs/own-seam/ckpt/", manifest_sha256="0" * 64
    )
    return TrainSFTResult(
        step=2,
        checkpoint=checkpoint,
        adapter="own-seam@2",
        trained=trained,
        seconds={"train": 0.3, "publish": 0.7},
    )


def test_dgrpos_batches_are_the_trainers_and_average_to_the_steps_numbers() -> None:
    result = sft_result([0.9, 0.6, 0.3], [1e-3, 2e-3, 3e-3], [0.3, 0.2, 0.1], seconds=0.1)
    rows = batch_metrics(result)
    assert [r["loss/train"] for r in rows] == [0.9, 0.6, 0.3]
    assert [r["loss/learning_rate"] for r in rows] == [1e-3, 2e-3, 3e-3]
    assert all(r["data/step_num_trajectories"] == 5 and r["data/step_num_gradient_steps"] == 3 for r in rows)
    # The workflow's times are measured once: with the last batch, so their mean is the time as measured.
    assert "time/step_trainer_s" not in rows[0] and rows[-1]["time/step_trainer_s"] == 0.1
    averaged = result_metrics(result)
    assert averaged["loss/train"] == pytest.approx(0.6) and averaged["loss/grad_norm"] == pytest.approx(0.2)
    assert (averaged["time/step_trainer_s"], averaged["time/step_publish_s"]) == (0.1, 0.7)
    assert averaged["data/step_trainer_tokens"] == 40 and averaged["data/step_num_dropped_trajectories"] == 1
    assert batch_metrics(result.model_copy(update={"trained": None})) == []


class TrainSeamBackend(LocalBackend):
    """dgrpo's ``LocalBackend`` (never started) with ART's ``_train_model`` and ``_get_step`` of the test's
    own; tests/dgrpo/test_art_sft.py trains through dgrpo's ``_train_model`` on the real stack."""

    def __init__(self, path: Path, rows: list[dict[str, float]], step: int) -> None:
        super().__init__(path)
        self.rows, self.step = rows, step
        self.calls: list[tuple[list[art.TrajectoryGroup], TrainConfig, Mapping[str, Any], bool]] = []

    async def _train_model(
        self,
        model: art.TrainableModel,
        trajectory_groups: list[art.TrajectoryGroup],
        config: TrainConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        self.calls.append((trajectory_groups, config, dev_config, verbose))
        for row in self.rows:
            yield row

    async def _get_step(self, model: art.TrainableModel) -> int:
        return self.step


def rewarded_group(*rewards: float) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        [
            art.Trajectory(
                reward=r,
                messages_and_choices=[
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ],
            )
            for r in rewards
        ]
    )


async def test_backend_train_averages_its_train_models_rows_at_the_step_it_then_reports(
    tmp_path: Path,
) -> None:
    rows = [
        {"loss/train": 1.0, "data/step_num_gradient_steps": 2.0},
        {"loss/train": 0.5, "data/step_num_gradient_steps": 2.0, "time/step_trainer_s": 4.0},
    ]
    backend = TrainSeamBackend(tmp_path / "stack", rows, step=6)
    model = art.TrainableModel(name="seam", project="own", base_model="m", base_path=str(tmp_path))
    groups = [rewarded_group(1.0, 0.0), rewarded_group(0.5, 0.5)]
    result = await backend.train(model, groups, learning_rate=2e-5, loss_fn="ppo", save_checkpoint=False)

    [(trained, config, dev_config, verbose)] = backend.calls
    assert trained == groups and dev_config == {} and not verbose
    assert (config.learning_rate, config.importance_sampling) == (2e-5, "ppo_clip")  # ART's options, mapped
    assert result.step == 6 and result.checkpoint_path is None
    assert result.metrics["loss/train"] == 0.75 and result.metrics["data/step_num_gradient_steps"] == 2.0
    assert result.metrics["time/step_trainer_s"] == 4.0  # the backend's own time is kept
    assert result.metrics["data/step_num_trajectories"] == 4.0  # counted from the groups, as ART's
    with pytest.raises(UnsupportedArtOption, match="kl_penalty_coef"):  # refused before training
        await backend.train(model, groups, kl_penalty_coef=0.1)
    assert len(backend.calls) == 1


async def test_backend_train_refuses_rows_that_disagree_on_the_gradient_steps(tmp_path: Path) -> None:
    rows = [{"data/step_num_gradient_steps": 2.0}, {"data/step_num_gradient_steps": 3.0}]
    backend = TrainSeamBackend(tmp_path / "stack", rows, step=1)
    with pytest.raises(ValueError, match="step_num_gradient_steps"):
        await backend.train(art.TrainableModel(name="seam", base_path=str(tmp_path)), [rewarded_group(1, 0)])
