"""Client behaviours ART's unit tests rely on: group copies, names before ``register``, W&B config, ART's
policy-version fields. No stack: each runs in a moment."""

from __future__ import annotations

import copy
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import dgrpo as art
from activities.metrics import WandbSink
from activities.trajectory_store import groups_to_table, table_to_groups
from schemas.activities import MetricsInput


def test_copy_of_a_group_has_its_own_lists_and_the_same_trajectories() -> None:
    group = art.TrajectoryGroup(
        [art.Trajectory(reward=1.0), art.Trajectory(reward=0.5), ValueError("raised")], metadata={"s": "a"}
    )
    shallow = copy.copy(group)
    assert shallow is not group and shallow.trajectories is not group.trajectories
    assert shallow.trajectories[0] is group.trajectories[0]
    assert shallow.exceptions == group.exceptions and shallow.exceptions is not group.exceptions
    shallow.trajectories.pop()
    shallow.metadata["s"] = "b"
    assert (len(group.trajectories), group.metadata) == (2, {"s": "a"})
    deep = copy.deepcopy(group)
    assert deep.trajectories[0] is not group.trajectories[0] and deep.trajectories[0].reward == 1.0


def test_names_and_litellm_params_before_register_are_arts() -> None:
    model = art.TrainableModel(name="agent", project="p")
    assert (model.get_inference_name(), model.get_inference_name(3)) == ("agent", "agent@3")
    assert model.litellm_completion_params(2) == {
        "model": "hosted_vllm/agent@2",
        "base_url": None,
        "api_key": model.inference_api_key,
        "temperature": 1,
    }
    judge = art.Model(name="judge", inference_model_name="gpt-x")
    assert judge.litellm_completion_params()["model"] == "gpt-x"


def test_trajectory_takes_arts_policy_versions_and_the_store_keeps_them() -> None:
    trajectory = art.Trajectory(reward=1.0, initial_policy_version=3, final_policy_version=4)
    table = groups_to_table([art.TrajectoryGroup([trajectory])], run_id="run-v", step=1)
    stored = table_to_groups(table, "memory://run-v")[0].trajectories[0]
    assert (stored.initial_policy_version, stored.final_policy_version) == (3, 4)
    assert art.Trajectory().initial_policy_version is None


class FakeRun:
    _is_finished = False

    def __init__(self) -> None:
        self.config = types.SimpleNamespace(updates=[])
        self.config.update = self.config.updates.append  # type: ignore[attr-defined]
        self.logged: list[dict[str, Any]] = []

    def define_metric(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log(self, row: dict[str, Any]) -> None:
        self.logged.append(row)


def test_update_wandb_config_merges_and_refuses_a_changed_value() -> None:
    model = art.Model(name="m", project="p")
    model.update_wandb_config({"experiment": {"learning_rate": 1e-5}})
    model.update_wandb_config({"experiment": {"batch_size": 4, "learning_rate": 1e-5}, "dataset": "train"})
    with pytest.raises(
        ValueError,
        match=r"immutable once set\. Conflicting value for 'experiment\.batch_size': 4 set, 8 given",
    ):
        model.update_wandb_config({"experiment": {"batch_size": 8}})
    with pytest.raises(TypeError, match="config must be a dict"):
        model.update_wandb_config([("a", 1)])  # type: ignore[arg-type]


def test_a_wandb_run_starts_with_its_config_and_takes_later_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = FakeRun()
    inits: list[dict[str, Any]] = []

    def init(**kwargs: Any) -> FakeRun:
        inits.append(kwargs)
        return run

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=dict))
    sink = WandbSink(tmp_path / "wandb")
    sink.update_config("p-m", {"experiment": {"learning_rate": 1e-5}})
    sink.log(MetricsInput(run_id="p-m", project="p", model_name="m", step=1, metrics={"val/reward": 1}))
    assert inits[0]["config"] == {"experiment": {"learning_rate": 1e-5}}
    sink.update_config("p-m", {"experiment": {"learning_rate": 1e-5}, "seed": 7})
    assert run.config.updates == [  # type: ignore[attr-defined]
        {"experiment": {"learning_rate": 1e-5}},  # again after init, as ART: a resumed run keeps its old one
        {"experiment": {"learning_rate": 1e-5}, "seed": 7},
    ]
