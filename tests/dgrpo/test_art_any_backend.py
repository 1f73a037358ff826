"""A ``TrainableModel`` on any ``art.Backend``, as ART's model works: ``register`` asks ``backend.register`` and then
``_prepare_backend_for_training`` (with ``register(..., _openai_client_config=)``), ``get_step`` asks
``_get_step``, ``train`` iterates ``_train_model`` and logs its rows at the step the backend then reports,
``delete_checkpoints`` hands ``_delete_checkpoint_files`` the steps ART keeps; and what NeMo Agent Toolkit's ART
plugin needs to import and build (``art.backend``'s aliases, ``art.dev`` dicts as fields of its pydantic config,
an ``InternalModelConfig`` of ``None`` sections, choices with logprobs and no token ids).

``ArtServerClient`` is a backend of the test's own with ART's hooks and nothing more, as NAT's ``RemoteBackend``
(a client of ART's ``art run`` server) has them; dgrpo's ``LocalBackend`` fills the same hooks on the real stack
in tests/dgrpo/test_art_nat_step.py.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice as OpenAIChoice
from pydantic import BaseModel

import dgrpo as art
from dgrpo.art_compat.settings_rule import check_server_config
from dgrpo.backend import AnyModel, AnyTrainableModel
from dgrpo.errors import ArtSettingIgnored, UnsupportedArtOption


class ArtServerClient:
    """ART's hooks only: each call recorded, a step kept, ``rows`` yielded by each ``_train_model``."""

    def __init__(self, rows: list[dict[str, float]]) -> None:
        self.rows = rows
        self.step = 0
        self.calls: list[tuple[str, Any]] = []

    def _model_inference_name(self, model: AnyModel, step: int | None = None) -> str:
        return f"{model.name}@{self.step if step is None else step}"

    async def close(self) -> None:
        self.calls.append(("close", None))

    async def register(self, model: AnyModel) -> None:
        self.calls.append(("register", json.loads(json.dumps(model.model_dump(mode="json")))))

    async def _prepare_backend_for_training(
        self, model: AnyTrainableModel, config: Mapping[str, Any] | None
    ) -> tuple[str, str]:
        self.calls.append(("prepare", config))
        return "http://art-server:8000/v1", "server-key"

    async def _get_step(self, model: AnyTrainableModel) -> int:
        return self.step

    async def _delete_checkpoint_files(self, model: AnyTrainableModel, steps_to_keep: list[int]) -> None:
        self.calls.append(("delete", sorted(steps_to_keep)))

    async def _train_model(
        self,
        model: AnyTrainableModel,
        trajectory_groups: list[art.TrajectoryGroup],
        config: Any,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        self.calls.append(("train", (trajectory_groups, config, dict(dev_config), verbose)))
        for row in self.rows:
            yield row
        self.step += 1

    def _train_sft(
        self,
        model: AnyTrainableModel,
        trajectories: Iterable[art.Trajectory],
        config: art.TrainSFTConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        raise NotImplementedError


def nat_model(tmp_path: Path, **internal: Any) -> art.TrainableModel:
    """The model NAT's ``ARTTrainerAdapter`` builds from its default config."""
    sections = {"init_args": None, "engine_args": None, "trainer_args": None, **internal}
    return art.TrainableModel(
        name="trainer_run",
        project="trainer_project",
        base_model="Qwen/Qwen2.5-7B-Instruct",
        base_path=str(tmp_path),
        report_metrics=[],
        _internal_config=art.dev.InternalModelConfig(**sections),  # type: ignore[typeddict-item]
    )


def nat_group(*rewards: float) -> art.TrajectoryGroup:
    """Trajectories as NAT's adapter builds them: a user message, then an openai ``Choice`` made from its own
    LLM call's message and logprobs (no token ids)."""
    trajectories = []
    for reward in rewards:
        logprobs = {"content": [{"token": "token_id:42", "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
        choice = OpenAIChoice(
            index=0,
            logprobs=logprobs,  # type: ignore[arg-type]
            message={"role": "assistant", "content": "hi"},  # type: ignore[arg-type]
            finish_reason="stop",
        )
        trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=reward)
        trajectory.messages_and_choices.append(choice)
        trajectories.append(trajectory)
    return art.TrajectoryGroup(trajectories=trajectories)


def test_nats_imports_and_config_types() -> None:
    # NAT's plugin: `from art.backend import AnyModel, AnyTrainableModel`, ART's string aliases.
    assert (AnyModel, AnyTrainableModel) == ("Model[Any, Any]", "TrainableModel[Any, Any]")

    class BackendConfig(BaseModel):  # NAT's ARTBackendConfig's fields, typed with art.dev's dicts
        init_args: art.dev.InitArgs | None = None
        engine_args: art.dev.EngineArgs | None = None
        server_config: art.dev.OpenAIServerConfig | None = None
        training: art.dev.TrainerArgs | None = None

    config = BackendConfig.model_validate(
        {
            "init_args": {"max_seq_length": 8192},
            "engine_args": {"gpu_memory_utilization": 0.9, "tensor_parallel_size": 1},
            "training": {"learning_rate": 1e-6, "beta": 0.0},
        }
    )
    # Every key is kept for the settings rule to see (none dropped unseen).
    assert config.engine_args == {"gpu_memory_utilization": 0.9, "tensor_parallel_size": 1}
    assert config.training == {"learning_rate": 1e-6, "beta": 0.0}


def test_an_internal_config_of_none_sections_is_a_config_without_them(tmp_path: Path) -> None:
    model = nat_model(tmp_path)
    plain = art.TrainableModel(name="trainer_run", project="trainer_project", base_model=model.base_model)
    assert model.spec == plain.spec and model.train_defaults == {}
    # NAT's example YAML: mapped (max_seq_length), or accepted with one warning (engine, trainer's rate, beta).
    with pytest.warns(ArtSettingIgnored) as warned:
        model = nat_model(
            tmp_path,
            init_args={"max_seq_length": 8192},
            engine_args={"gpu_memory_utilization": 0.9, "tensor_parallel_size": 1},
            trainer_args={"learning_rate": 1e-6, "beta": 0.0},
        )
    assert model.train_defaults == {"max_seq_len": 8192}
    [warning] = warned
    assert "tensor_parallel_size=1" in str(warning.message) and "trainer_args.beta=0.0" in str(
        warning.message
    )


async def test_register_get_step_and_names_go_through_arts_hooks(tmp_path: Path) -> None:
    backend = ArtServerClient(rows=[])
    model = nat_model(tmp_path)
    server_config = {"server_args": {"port": 8000}}
    await model.register(backend, _openai_client_config=server_config)  # type: ignore[arg-type]

    (register, dumped), (prepare, given) = backend.calls
    assert (register, prepare, given) == ("register", "prepare", server_config)
    assert dumped["name"] == "trainer_run" and dumped["_internal_config"]["init_args"] is None
    assert (model.inference_base_url, model.inference_api_key) == ("http://art-server:8000/v1", "server-key")
    assert model.inference_model_name == "trainer_run@0"  # the backend's _model_inference_name, as in ART
    assert await model.get_step() == 0
    backend.step = 3
    assert (model.get_inference_name(), model.get_inference_name(1)) == ("trainer_run@3", "trainer_run@1")


async def test_train_iterates_the_backends_train_model_and_logs_its_rows_at_the_new_step(
    tmp_path: Path,
) -> None:
    rows = [{"loss/train": 1.0, "data/step_num_gradient_steps": 1.0}, {"loss/train": 0.5}]
    backend = ArtServerClient(rows)
    model = nat_model(tmp_path)
    await model.register(backend)  # type: ignore[arg-type]
    groups = [nat_group(1.0, 0.0), nat_group(0.5, 0.25)]
    # NAT's call: beta and the learning rate from getattr on its training dict.
    result = await model.train(
        groups, config=art.types.TrainConfig(beta=0, learning_rate=5e-5), verbose=False
    )

    [(_, (trained, config, dev_config, verbose))] = [c for c in backend.calls if c[0] == "train"]
    assert [len(g) for g in trained] == [2, 2] and dev_config == {} and verbose is False
    assert trained[0].trajectories[0].choices()[0].logprobs is not None  # logprobs, no token ids: accepted
    assert (config.learning_rate, config.kl_coef) == (5e-5, 0.0)
    assert result.step == 1 and result.metrics["loss/train"] == 0.75
    history = tmp_path / "trainer_project/models/trainer_run/history.jsonl"
    [row] = [json.loads(line) for line in history.read_text().splitlines()]
    assert row["step"] == 1 and row["loss/train"] == 0.75 and row["train/reward"] == pytest.approx(0.4375)


async def test_delete_checkpoints_keeps_the_newest_step_and_the_best_in_history(tmp_path: Path) -> None:
    backend = ArtServerClient(rows=[])
    model = nat_model(tmp_path)
    await model.register(backend)  # type: ignore[arg-type]
    for step, reward in ((1, 0.2), (2, 0.9), (3, 0.4)):
        await model.log(metrics={"reward": reward}, split="val", step=step)
    backend.step = 4
    assert await model.delete_checkpoints() == []
    assert backend.calls[-1] == ("delete", [2, 4])
    await model.delete_checkpoints("val/missing")
    assert backend.calls[-1] == ("delete", [4])


def test_arts_server_config_is_the_inference_workers_operators() -> None:
    ignored = check_server_config(
        {
            "log_file": "/tmp/vllm.log",
            "server_args": {"port": 8000, "api_key": "k", "return_tokens_as_token_ids": True},
            "engine_args": {"max_loras": 4},
        }
    )
    assert [item.split("=")[0] for item in ignored] == [
        "log_file",
        "server_args.port",
        "server_args.api_key",
        "server_args.return_tokens_as_token_ids",
        "engine_args.max_loras",
    ]
    assert "--max-loras" in ignored[-1] and "DGRPO_SERVE_API_KEY" in ignored[2]
    assert check_server_config({"server_args": None, "engine_args": None}) == []
    with pytest.raises(UnsupportedArtOption, match=r"lora_modules=.*serves the model's steps"):
        check_server_config({"server_args": {"lora_modules": ["other=/adapters/x"]}})
    with pytest.raises(UnsupportedArtOption, match=r"chat_template=.*_internal_config\['chat_template'\]"):
        check_server_config({"server_args": {"chat_template": "{{ messages }}"}})
    with pytest.raises(UnsupportedArtOption, match=r"engine_args.*model="):
        check_server_config({"engine_args": {"model": "other"}})
    with pytest.raises(UnsupportedArtOption, match="no such section"):
        check_server_config({"servers": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_server_config({}) == []
