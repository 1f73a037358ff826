"""The trainer on a Qwen3-architecture model (the session's tiny random Qwen3): the adapter covers the
architecture's projections, gradient checkpointing changes nothing but memory, precision ``auto`` is fp32 on a
CPU, and a local ``base_model`` is read only from under the worker's model roots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from activities.device import resolve_precision
from activities.lora_targets import PROJECTIONS, lora_target_modules
from activities.tokenize import TrainSequence
from activities.trainer import Trainer
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.errors import RunSpecError, UnsafePathError
from schemas.settings import ENV_MODEL_ROOTS


def spec(base_model: Path | str) -> ModelSpec:
    return ModelSpec(name="shape", base_model=str(base_model), lora=LoraConfig(rank=4, alpha=8))


def sequences(n: int, length: int, seed: int) -> list[TrainSequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        tokens = torch.randint(100, 40000, (length,), generator=g).tolist()
        prompt = length // 3
        trainable = [False] * prompt + [True] * (length - prompt)
        sampled = [float("nan")] * length  # the current policy's own: ratio 1
        out.append(TrainSequence(tokens, trainable, sampled, float(torch.randn(1, generator=g)), i))
    return out


def test_the_adapter_covers_every_qwen3_projection_and_nothing_else(tiny_qwen3: Path) -> None:
    trainer = Trainer(spec(tiny_qwen3))
    adapted = {name.split(".")[-1] for name in trainer.model.targeted_module_names}
    assert adapted == set(PROJECTIONS) and len(trainer.model.targeted_module_names) == 2 * len(PROJECTIONS)
    assert (
        trainer.precision == "fp32" and trainer.model.get_base_model().dtype == torch.float32
    )  # auto on a CPU


def test_target_modules_of_an_unknown_architecture_or_a_missing_name_are_refused_naming_the_fix() -> None:
    linear = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    with pytest.raises(RunSpecError, match=r"'gpt_neox'.*list the modules to adapt.*dense_4h_to_h"):
        lora_target_modules("gpt_neox", "all-linear", linear)
    assert lora_target_modules("gpt_neox", ["query_key_value"], linear) == ["query_key_value"]
    with pytest.raises(RunSpecError, match="names q_proj, which this qwen3 model does not have"):
        lora_target_modules("qwen3", ["q_proj"], {"k_proj"})
    assert lora_target_modules("qwen3", "all-linear", set(PROJECTIONS)) == PROJECTIONS


def test_precision_auto_is_bf16_only_on_a_gpu_that_has_it() -> None:
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"  # asked for, it is autocast
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"


def test_gradient_checkpointing_recomputes_each_layer_and_trains_the_same_update(tiny_qwen3: Path) -> None:
    trainer = Trainer(spec(tiny_qwen3), "fp32")
    calls = []
    # The MLP inside the first layer starts again in the backward pass when its layer is checkpointed (the
    # recompute stops as soon as it has what the backward needs, so a hook at its end would not see it).
    trainer.model.get_base_model().model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    data, config = sequences(4, 48, seed=1), TrainConfig(learning_rate=1e-2)
    updates = {}
    for checkpointing in (False, True):
        trainer.init_adapter(seed=0)
        trainer.optimizer = None
        trainer.use_gradient_checkpointing(checkpointing)
        calls.clear()
        trainer.train_step(data, config, step=1, micro_batch_size=2)
        updates[checkpointing] = (trainer.adapter_state(), len(calls))
    (plain, plain_calls), (lean, lean_calls) = updates[False], updates[True]
    assert (plain_calls, lean_calls) == (2, 4)  # two micro-batches; each layer forwarded again in backward
    assert plain.keys() == lean.keys()
    for key in plain:
        torch.testing.assert_close(lean[key], plain[key], rtol=1e-5, atol=1e-7)
    assert any(float(v.abs().max()) > 0 for k, v in plain.items() if "lora_B" in k)  # it did train


def test_the_plan_keeps_a_step_that_fits_as_asked(tiny_qwen3: Path) -> None:
    trainer = Trainer(spec(tiny_qwen3))
    plan = trainer.plan_memory(sequences(8, 64, seed=2), requested=8)
    assert (plan.micro_batch, plan.gradient_checkpointing) == (8, False)  # a few MB on a machine with GBs


def test_a_local_base_model_outside_the_model_roots_is_refused(
    tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_MODEL_ROOTS, str(tmp_path / "models"))
    with pytest.raises(
        UnsafePathError, match=f"outside the directories this trainer reads.*{ENV_MODEL_ROOTS}"
    ) as err:
        Trainer(spec(tiny_qwen3))
    assert not err.value.retryable
