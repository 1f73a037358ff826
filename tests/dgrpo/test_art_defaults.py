"""An ART program (``import dgrpo as art``) trains with ART's defaults where it sets nothing (read from the ART
0.5.23 wheel: dgrpo/art_compat/defaults.py), a ``RunSpec`` with dgrpo's own; what a program, its model's
``_internal_config`` or ``backend.train`` gives wins, in that order; ART 0.5.23's ``TrainConfig`` fields are
taken, refused where dgrpo would train otherwise.

``CapturingBackend`` is dgrpo's ``LocalBackend`` (never started) with ``_train_model`` of the test's own, the
seam whose config ``backend.train`` hands the durable step (tests/dgrpo/test_art_program.py trains through the real
one)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import dgrpo as art
from dgrpo.errors import UnsupportedArtOption
from dgrpo.local import LocalBackend
from schemas.config import LoraConfig, ModelSpec, RunSpec, TrainConfig

ART_STEP = {
    "learning_rate": 5e-6,
    "importance_sampling": "cispo",
    "epsilon": 1.0,
    "epsilon_high": 4.0,
    "max_grad_norm": 0.1,
    "weight_decay": 0.1,
    "optimizer": "paged_adamw_8bit",
    "adam_beta1": 0.9,
    "adam_beta2": 0.99,
    "length_weighting": True,
    "max_seq_len": 32768,
}


class CapturingBackend(LocalBackend):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.configs: list[TrainConfig] = []

    async def _train_model(
        self,
        model: art.TrainableModel,
        trajectory_groups: list[art.TrajectoryGroup],
        config: TrainConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        self.configs.append(config)
        yield {"loss/train": 0.0}

    async def _get_step(self, model: art.TrainableModel) -> int:
        return len(self.configs)


def chosen(config: TrainConfig) -> dict[str, Any]:
    return {key: getattr(config, key) for key in ART_STEP}


async def test_an_art_program_that_sets_nothing_trains_with_arts_defaults(tmp_path: Path) -> None:
    backend = CapturingBackend(tmp_path / "stack")
    model = art.TrainableModel(name="agent", project="p", base_model="smollm2-135m-instruct")
    assert model.spec.lora == LoraConfig(rank=8, alpha=16, dropout=0.0, target_modules="all-linear")
    await backend.train(model, [])
    assert chosen(backend.configs[-1]) == ART_STEP
    assert chosen(model.step_config(None, {})) == ART_STEP  # model.train's, as backend.train's
    assert chosen(model.step_config(art.TrainConfig(), {})) == ART_STEP
    await backend.train(model, [], loss_fn="ppo")  # ART's PPO and its clip
    assert (backend.configs[-1].importance_sampling, backend.configs[-1].epsilon) == ("ppo_clip", 0.2)
    assert backend.configs[-1].epsilon_high is None
    assert art.TrainConfig().learning_rate == 5e-6  # ART's art.TrainConfig default, read by programs


async def test_what_the_program_and_its_model_set_wins_over_arts_defaults(tmp_path: Path) -> None:
    backend = CapturingBackend(tmp_path / "stack")
    model = art.TrainableModel(
        name="agent",
        lora_config=art.LoRAConfig(alpha=8),
        _internal_config={"trainer_args": {"max_grad_norm": 0.5, "adam_beta2": 0.95}},
    )
    assert (model.spec.lora.rank, model.spec.lora.alpha) == (8, 8)  # ART's rank, the program's alpha
    peft = art.TrainableModel(name="agent", _internal_config={"peft_args": {"r": 4}})
    assert (peft.spec.lora.rank, peft.spec.lora.alpha) == (4, 16)
    await backend.train(model, [], learning_rate=1e-4, epsilon=0.3)
    config = backend.configs[-1]
    assert (config.learning_rate, config.epsilon, config.epsilon_high) == (1e-4, 0.3, 4.0)
    assert (config.max_grad_norm, config.adam_beta2, config.weight_decay) == (0.5, 0.95, 0.1)
    own = model.step_config(art.TrainConfig(max_grad_norm=1.0, optimizer="adamw"), {})
    assert (own.max_grad_norm, own.optimizer, own.adam_beta2) == (1.0, "adamw", 0.95)


def test_a_run_spec_keeps_dgrpos_own_defaults() -> None:
    spec = RunSpec.model_validate(
        {
            "run_id": "own",
            "steps": 1,
            "groups_per_step": 1,
            "group_size": 2,
            "model": {"name": "m", "base_model": "smollm2-135m-instruct"},
            "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        }
    )
    assert spec.model.lora == LoraConfig(rank=16, alpha=32.0) == ModelSpec(name="m", base_model="b").lora
    train = spec.train
    assert (train.importance_sampling, train.learning_rate, train.max_grad_norm) == ("ppo_clip", 2e-4, 1.0)
    assert (train.weight_decay, train.adam_beta2, train.optimizer) == (0.0, 0.999, "adamw")
    assert (train.epsilon, train.length_weighting, train.max_seq_len) == (0.2, False, 2048)


def test_arts_0523_train_config_fields_are_taken_or_refused_saying_why() -> None:
    model = art.TrainableModel(name="agent")
    # What ART 0.5.23's client sends: its TrainConfig, every field.
    sent = {
        "learning_rate": 1e-5,
        "kl_penalty_coef": 0.0,
        "kl_penalty_source": "sample",
        "grad_accumulation_sequences": None,
        "optimizer_save_interval": 2,
        "final_training_step": 10,
    }
    step = model.step_config(art.TrainConfig(**sent), {})
    assert step.learning_rate == 1e-5 and type(step) is TrainConfig  # the workflow's plain TrainConfig
    with pytest.raises(UnsupportedArtOption, match=r"kl_penalty_coef=0.1.*TrainConfig\(beta=...\)"):
        model.step_config(art.TrainConfig(**{**sent, "kl_penalty_coef": 0.1}), {})
    with pytest.raises(UnsupportedArtOption, match=r"grad_accumulation_sequences=4.*one optimizer step"):
        model.step_config(art.TrainConfig(**{**sent, "grad_accumulation_sequences": 4}), {})
