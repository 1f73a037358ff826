"""ART's automatic numbers of a local run: each ``train`` row at a new step gets ``time/step_wall_s`` (the
seconds since the previous step's row) and, when the backend knows a price, ``costs/gpu`` for those seconds,
rolled into ``costs/all`` and the running totals; a backend's GPUs priced from its device names.

The backend is dgrpo's ``LocalBackend``, never started (``model.log`` of a model it holds needs no stack);
the CUDA queries are torch's own functions, replaced where the test names a device this machine lacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import dgrpo as art
from dgrpo.errors import UnsupportedArtOption
from dgrpo.local import LocalBackend
from dgrpo.local.backend import detected_gpu_price


def model_on(backend: LocalBackend, tmp_path: Path, **internal: Any) -> art.TrainableModel:
    model = art.TrainableModel(
        name="gpu", project="own", base_model="m", base_path=str(tmp_path), report_metrics=[],
        _internal_config=internal or None,
    )  # fmt: skip
    model._backend = backend  # type: ignore[assignment]  # ART's way of giving a model a backend object
    return model


def history(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "own/models/gpu/history.jsonl").read_text().splitlines()]


async def test_each_new_train_step_costs_its_wall_time_on_the_models_gpus(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "stack", gpu_cost_per_hour_usd=3.0)
    model = model_on(backend, tmp_path, trainer_gpu_ids=[0], inference_gpu_ids=[1])  # two GPUs: $6 an hour
    await model.log(split="train", step=1, metrics={"loss/train": 1.0})
    await model.log(split="train", step=1, metrics={"loss/grad_norm": 0.1})  # the same step: no new numbers
    await model.log(split="train", step=2, metrics={"loss/train": 0.5})
    await model.log(split="val", step=2, metrics={"reward": 0.5})  # not a train row

    first, same, second, val = history(tmp_path)
    for row in (first, second):
        assert row["time/step_wall_s"] > 0
        assert row["costs/gpu"] == pytest.approx(row["time/step_wall_s"] * 6.0 / 3600)
        assert row["costs/all"] == row["costs/gpu"]
    assert second["costs/cum/gpu"] == pytest.approx(first["costs/gpu"] + second["costs/gpu"])
    assert "time/step_wall_s" not in same and "costs/gpu" not in same
    assert "time/step_wall_s" not in val and "costs/gpu" not in val


async def test_numbers_the_caller_gives_win_and_no_price_means_no_cost(tmp_path: Path) -> None:
    priced = model_on(
        LocalBackend(tmp_path / "stack", gpu_cost_per_hour_usd=3.0), tmp_path, trainer_gpu_ids=[0]
    )
    await priced.log(split="train", step=1, metrics={"time/step_wall_s": 7200.0, "costs/gpu": 1.5})
    [row] = history(tmp_path)
    assert (row["time/step_wall_s"], row["costs/gpu"]) == (7200.0, 1.5)

    (tmp_path / "own/models/gpu/history.jsonl").unlink()
    unpriced = model_on(LocalBackend(tmp_path / "stack"), tmp_path, trainer_gpu_ids=[0])
    await unpriced.log(split="train", step=2, metrics={"loss/train": 1.0})
    [row] = history(tmp_path)
    assert row["time/step_wall_s"] > 0 and "costs/gpu" not in row and "costs/all" not in row


def test_gpus_are_priced_only_when_every_one_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    devices: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(devices))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: devices[i])
    assert detected_gpu_price() is None  # no CUDA
    devices[:] = ["NVIDIA H200", "NVIDIA H200 NVL"]
    assert detected_gpu_price() == 3.0
    devices[:] = ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]
    assert detected_gpu_price() is None  # one unknown: no guess
    devices[:] = ["NVIDIA H200"]
    model = art.TrainableModel(name="m")
    assert LocalBackend("/nonexistent").automatic_gpu_cost_per_hour_usd(model) == 3.0  # the workers' one GPU
    devices[:] = []
    priced = LocalBackend("/nonexistent", gpu_cost_per_hour_usd=2.0)
    assert priced.automatic_gpu_cost_per_hour_usd(model) is None  # no GPU for the workers: no cost


async def test_gpu_ids_are_kept_for_the_count_and_refused_by_register(tmp_path: Path) -> None:
    model = art.TrainableModel(name="m", _internal_config={"trainer_gpu_ids": [0], "inference_gpu_ids": [1]})
    with pytest.raises(
        UnsupportedArtOption, match=r"trainer_gpu_ids=\[0\].*CUDA_VISIBLE_DEVICES=0 dgrpo worker"
    ):
        await model.register(LocalBackend(tmp_path / "stack"))
    assert not (tmp_path / "stack").exists()  # refused before the backend started anything
