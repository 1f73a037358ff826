"""Programs that make every ART call of ART's 2048, self-play tic-tac-toe and temporal-clue examples (and
mcp-rl's model set-up), as those examples make them (tests/examples/art_programs/, written in our own words),
each training two steps of SmolLM2-135M on the examples' shared backend. Their RULER judge and teacher are the
scripted OpenAI-compatible stub, reached only through ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; their S3
backup is the stack's SeaweedFS reached as AWS S3 is (``AWS_ENDPOINT_URL``, ``BACKUP_BUCKET``)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from activities.object_store import ObjectStore
from dgrpo.client.backup_bucket import BackupBucket
from dgrpo.errors import ArtSettingIgnored, ModelConflictError
from dgrpo.model import run_id_of
from schemas import layout
from schemas.config import ModelSpec
from tests.examples.art_programs import game_2048, self_play, temporal_clue
from tests.examples.stored_run import stored_run
from workers.stack import EmbeddedStack

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import StubServer, openai_stub

JUDGE_KEY = "sk-test-judge"


def ranked(body: dict[str, Any]) -> str:
    """A RULER answer scoring the trajectories it is shown by their order (so a group's scores differ); any
    other request (a teacher's) gets a move."""
    prompt = " ".join(str(m.get("content")) for m in body["messages"])
    ids = re.findall(r'<trajectory id="(\d+)">', prompt)
    if not ids:
        return "B2"
    scores = [{"trajectory_id": i, "explanation": "ranked", "score": round(0.1 + 0.8 * k / max(1, len(ids) - 1), 3)}
              for k, i in enumerate(ids)]  # fmt: skip
    return json.dumps({"scores": scores})


@pytest.fixture
def judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[StubServer]:
    with openai_stub() as stub:
        stub.reply = ranked
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", JUDGE_KEY)
        yield stub


@pytest.fixture
def backup(held_backend: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[BackupBucket]:
    """The backend's own SeaweedFS as the program's "AWS" bucket (only the AWS variables), and a working
    directory of its own for ART's local files (``.art/``)."""
    settings = EmbeddedStack(held_backend).s3_settings
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{settings.endpoint.removeprefix('http://')}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", settings.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", settings.secret_key.get_secret_value())
    bucket = f"art-backup-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("BACKUP_BUCKET", bucket)
    monkeypatch.chdir(tmp_path)
    backup = BackupBucket(bucket)
    yield backup
    if backup.client.bucket_exists(bucket):
        backup.delete(backup.keys(""))
        backup.client.remove_bucket(bucket)


def history_rows(*model_dir: str) -> list[dict[str, Any]]:
    """The rows of ``.art/<model dir>/history.jsonl`` (ART's local log, in the test's working directory)."""
    return [json.loads(row) for row in Path(".art", *model_dir, "history.jsonl").read_text().splitlines()]


def is_local_checkpoint(path: Path, *model_dir: str, step: int) -> bool:
    """``path`` is ART's local checkpoint folder of ``step`` and holds a PEFT adapter."""
    expected = Path(".art", *model_dir, "checkpoints", layout.art_checkpoint_name(step))
    return path.resolve() == expected.resolve() and (path / "adapter_config.json").is_file()


def store_of(home: Path) -> ObjectStore:
    return ObjectStore(EmbeddedStack(home).s3_settings)


def check_trained(
    home: Path, run_id: str, trained: list[list[Any]], per_step: int
) -> dict[int, dict[str, float]]:
    """Each step trained on groups whose rewards differ, and its recorded numbers are those groups'."""
    records, checkpoints = stored_run(home, run_id)
    assert checkpoints[-1] == len(trained) == 2
    for step, groups in enumerate(trained, start=1):
        rewards = [t.reward for g in groups for t in g]
        assert len(rewards) == per_step and len(set(rewards)) > 1  # a learning signal
        assert records[step]["train/reward"] == pytest.approx(statistics.fmean(rewards))
        assert records[step]["loss/train"] == records[step]["loss/train"]  # a number, not NaN
    return records


@pytest.mark.slow
async def test_a_2048_program_trains_judged_by_an_openai_named_judge_and_resumes_from_its_backup(
    held_backend: Path, judge: StubServer, backup: BackupBucket, tmp_path: Path
) -> None:
    model, trained = await game_2048.train(str(held_backend))
    run_id = run_id_of("art-2048-copies", "2048-002")
    assert model.run_id == run_id
    recorded = ModelSpec.model_validate_json(store_of(held_backend).get_bytes(layout.model_key(run_id)))
    assert (recorded.name, recorded.project) == ("2048-002", "art-2048-copies")  # the copy's names, as set
    assert model.max_seq_len == 1024 and model.config is not None and model.config.max_moves == 1
    check_trained(held_backend, run_id, trained, per_step=game_2048.ROLLOUTS)
    for t in (t for groups in trained for g in groups for t in g):
        assert t.reward == t.metrics["ruler_score"] and "independent_reward" in t.metrics  # the judge's
    assert judge.calls == 2 and {r["model"] for r in judge.requests} == {"o4-mini"}
    assert set(judge.keys) == {JUDGE_KEY}  # OPENAI_API_KEY, sent to OPENAI_BASE_URL only
    base = "art-2048-copies/models/2048-002/"
    keys = set(backup.keys(base))
    for key in ("checkpoints/0001/adapter_config.json", "checkpoints/0002/manifest.json", "history.jsonl",
                "trajectories/train/0001.parquet", "state.json"):  # fmt: skip
        assert base + key in keys
    with pytest.raises(ModelConflictError, match="base_model"):
        model.base_model = "another/base"  # registered: its checkpoints belong to the base it has

    # Lose the store's checkpoints and the local files; the same program, run again, resumes from the backup.
    store_of(held_backend).delete_prefix(layout.checkpoints_prefix(run_id))
    shutil.rmtree(tmp_path / ".art")
    resumed, again = await game_2048.train(str(held_backend))
    assert again == [] and await resumed.get_step() == 2  # imported steps 1 and 2: nothing left to train
    assert resumed.get_inference_name() == layout.adapter_name(run_id, 2)
    assert stored_run(held_backend, run_id)[1] == [1, 2]
    history = history_rows("art-2048-copies", "models", "2048-002")
    assert sorted({row["step"] for row in history}) == [1, 2]  # model.log's rows came back too


@pytest.mark.slow
async def test_a_self_play_program_trains_with_its_gather_by_index_teacher_and_deploy_step(
    held_backend: Path, judge: StubServer, backup: BackupBucket, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.warns(ArtSettingIgnored, match=r"engine_args.num_scheduler_steps=1"):
        model, trained = await self_play.train(str(held_backend))
    run_id = run_id_of(self_play.PROJECT, self_play.NAME)
    records = check_trained(held_backend, run_id, trained, per_step=2 * self_play.GAMES)
    assert all(len(g.trajectories) == self_play.GAMES for groups in trained for g in groups)  # x's and o's
    teacher_asks = [
        r for r in judge.requests if r.get("reasoning_effort") == "low"
    ]  # the teacher's, per step
    assert len(teacher_asks) == 2 and {r["model"] for r in teacher_asks} == {"o4-mini"}
    assert any(
        r["model"] == "o4-mini" and "reasoning_effort" not in r for r in judge.requests
    )  # o4-mini plays val
    history = history_rows(self_play.PROJECT, "models", self_play.NAME)
    [val] = [row for row in history if "val/reward" in row]
    assert val["step"] == 0 and val["val/reward"] == records[0]["val/reward"]
    with pytest.raises(openai.BadRequestError, match="not enforced by this server"):
        await model.openai_client().chat.completions.create(  # what the program sends on vLLM, refused here
            model=model.get_inference_name(),
            messages=[{"role": "user", "content": "Your move."}],
            max_completion_tokens=4,
            extra_body={"guided_choice": ["B2"]},
        )
    path = Path(await self_play.deploy_step(str(held_backend), step=2))
    assert is_local_checkpoint(path, self_play.PROJECT, "models", self_play.NAME, step=2)
    assert "not deployed: deploy_model(provider='together')" in capsys.readouterr().out


@pytest.mark.slow
async def test_a_temporal_clue_program_trains_with_its_gpu_setting_accepted_and_backs_up(
    held_backend: Path, backup: BackupBucket
) -> None:
    with pytest.warns(
        ArtSettingIgnored, match=r"init_args.gpu_memory_utilization=0.775.*--gpu-memory-utilization"
    ):
        _, trained = await temporal_clue.train(str(held_backend))
    run_id = run_id_of("art-temporal-clue", "001")
    records = check_trained(held_backend, run_id, trained, per_step=3)
    assert "val/reward" in records[0] and "val/acc" in records[1]  # model.log(val_groups) before each step
    base = "art-temporal-clue/models/001/"
    keys = set(backup.keys(base))
    assert base + "checkpoints/0001/adapter_model.safetensors" in keys  # pushed before step 2 trained
    assert base + "trajectories/val/0000.parquet" in keys and base + "trajectories/val/0001.parquet" in keys
