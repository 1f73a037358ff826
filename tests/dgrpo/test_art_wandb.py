"""A model's W&B run laid out as ART lays it out (``WandbSink``, read back from a real offline run): ART's
sections plotted against ``training_step``, each row the one ``model.log`` wrote to ``history.jsonl``, the
config given at the start. No stack: ``model.log`` of an unregistered model reaches W&B, as in ART."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dgrpo as art
from tests.wandb_records import history, records

ARTS_SECTIONS = ["reward", "loss", "throughput", "costs", "time", "data", "train", "val", "test", "discarded"]


async def test_model_log_rows_reach_wandb_as_in_history_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline, under <base_path>/wandb/<run id>/
    model = art.Model(name="judge", project="p", base_path=str(tmp_path), report_metrics=["wandb"])
    model.update_wandb_config({"experiment": {"learning_rate": 1e-5}})
    await model.log(metrics={"costs/train/sample": 0.1, "turns": 2.0}, split="train", step=1)
    await model.log(metrics={"offpolicy/age": 1.0}, split="versus-base", step=2)
    model.finish_wandb()

    (run_dir,) = (tmp_path / "wandb" / "p-judge" / "wandb").glob("offline-run-*-p-judge")
    lines = (tmp_path / "p" / "models" / "judge" / "history.jsonl").read_text().splitlines()
    in_history = [
        {k: v for k, v in json.loads(line).items() if k not in ("step", "recorded_at")} for line in lines
    ]
    in_wandb = [{k: v for k, v in row.items() if not k.startswith("_")} for row in history(run_dir)]
    assert in_wandb == in_history
    assert in_wandb[0]["costs/cum/train/sample"] == pytest.approx(0.1)  # the builder's roll-ups, as ART's

    written = records(run_dir)
    axes = [
        (r.metric.name or r.metric.glob_name, r.metric.step_metric)
        for r in written
        if r.WhichOneof("record_type") == "metric"
    ]
    opened = [("training_step", ""), ("time/wall_clock_sec", "")]
    opened += [(f"{section}/*", "training_step") for section in ARTS_SECTIONS]
    assert axes[: len(opened)] == opened  # ART's define_metric calls, in ART's order
    one_by_one = dict(axes[len(opened) :])
    assert one_by_one["costs/cum/train/sample"] == "training_step"  # nested cost keys, as ART defines them
    assert one_by_one["versus-base/offpolicy/age"] == "training_step"  # outside ART's sections: dgrpo's
    assert "train/turns" not in one_by_one  # under train/*
    (run,) = [r.run for r in written if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name) == ("p-judge", "p", "judge")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["experiment"] == {"learning_rate": 1e-5}  # given to wandb.init


def test_no_wandb_run_unless_report_metrics_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert art.Model(name="m", project="p", base_path=str(tmp_path))._get_wandb_run() is None
    quiet = art.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=[])
    monkeypatch.setenv("WANDB_API_KEY", "unused")
    assert quiet._get_wandb_run() is None
