"""ART's models are pydantic models, and dgrpo's are too: generic, copied with ``model_copy``, held in the
program's own pydantic fields, and set after construction, with what follows from their fields (run id, spec,
``max_seq_len``, local log directory, client) derived when used. No stack: the registered cases are in the
example programs (tests/examples/test_art_programs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import dgrpo as art
from dgrpo.art_compat.options import train_config_fields
from dgrpo.errors import ArtSettingIgnored, ModelConflictError, NotRegisteredError, UnsupportedArtOption


class PolicyConfig(BaseModel):
    max_turns: int = 3
    server: str = "weather"


POLICIES: dict[str, art.TrainableModel[PolicyConfig]] = {}  # evaluated at import, as mcp-rl's is


class Scenario(BaseModel):
    """A program's own pydantic model with a model in a field (self-play's ``x_teacher: art.Model | None``)."""

    teacher: art.Model | None = None
    player: art.Model[PolicyConfig]


def policy(**fields: object) -> art.TrainableModel[PolicyConfig]:
    values: dict[str, object] = {"name": "agent", "project": "p", "config": PolicyConfig()} | fields
    return art.TrainableModel(**values)  # type: ignore[arg-type]


def test_models_subscript_and_a_parametrized_model_validates_its_config() -> None:
    typed = art.TrainableModel[PolicyConfig](name="agent", config={"max_turns": 5})  # type: ignore[arg-type]
    assert isinstance(typed.config, PolicyConfig) and typed.config.max_turns == 5
    assert isinstance(typed, art.TrainableModel) and isinstance(typed, art.Model)
    assert art.Model[PolicyConfig, dict] is not None  # ART's second parameter (the state type)
    assert art.TrainableModel(name="a", config={"any": "thing"}).config == {"any": "thing"}  # unparametrized


def test_a_model_in_a_pydantic_field_is_the_same_object() -> None:
    teacher = art.Model(name="judge", inference_base_url="http://x/v1")
    player = policy()
    scenario = Scenario(teacher=teacher, player=player)
    assert scenario.teacher is teacher and scenario.player is player


def test_a_deep_copy_owns_its_settings_and_starts_unregistered(tmp_path: Path) -> None:
    source = policy(_internal_config={"init_args": {"max_seq_length": 512}})
    source._backend = art.LocalBackend(path=tmp_path)  # type: ignore[assignment]  # bound, as ART's tests bind
    copy = source.model_copy(deep=True)
    copy.config.max_turns = 9  # type: ignore[union-attr]
    copy._internal_config["init_args"]["max_seq_length"] = 64  # type: ignore[index]
    assert (source.config.max_turns, source.max_seq_len) == (3, 512)  # type: ignore[union-attr]
    assert (copy.config.max_turns, copy.max_seq_len) == (9, 64)  # type: ignore[union-attr]
    assert source.backend() is source._backend
    with pytest.raises(NotRegisteredError):
        copy.backend()  # a copy is a new model: register it


def test_a_copy_renamed_before_register_trains_its_new_identity() -> None:
    """mcp-rl's pattern: copy a model, then set name, base_model and project; run id and spec follow."""
    base = policy(base_model="smollm2-135m-instruct")
    copy = base.model_copy(deep=True)
    copy.name, copy.project, copy.base_model = "agent-14b", "q", "other/base"
    assert copy.run_id == "q-agent-14b"
    assert (copy.spec.name, copy.spec.project, copy.spec.base_model) == ("agent-14b", "q", "other/base")
    assert (base.run_id, base.spec.base_model) == ("p-agent", "smollm2-135m-instruct")


def test_settings_set_after_construction_are_checked_and_used() -> None:
    model = policy()
    assert model.step_config(None, {}).max_seq_len == 32768  # ART's default
    model._internal_config = art.dev.InternalModelConfig(init_args=art.dev.InitArgs(max_seq_length=8192))
    assert model.step_config(None, {}).max_seq_len == 8192  # 2048's assignment: used by the next step
    model.lora_config = {"rank": 8, "alpha": 16}
    assert (model.spec.lora.rank, model.spec.lora.alpha) == (8, 16)
    with pytest.raises(UnsupportedArtOption, match="model_name"):
        model._internal_config = {"init_args": {"model_name": "another/base"}}  # what is trained: refused
    with pytest.raises(UnsupportedArtOption, match="give the LoRA shape once"):
        model._internal_config = {"peft_args": {"r": 4}}  # disagrees with lora_config
    assert model.max_seq_len == 8192 and model.spec.lora.rank == 8  # a refused assignment changed nothing


def test_names_follow_the_fields_as_they_are_now(tmp_path: Path) -> None:
    model = policy(base_path=str(tmp_path))
    assert (model.get_inference_name(), model.local_log().dir) == ("agent", tmp_path / "p/models/agent")
    model.name, model.project = "agent-2", "q"
    assert (model.get_inference_name(2), model.run_id) == ("agent-2@2", "q-agent-2")
    assert model.local_log().dir == tmp_path / "q/models/agent-2"
    judge = art.Model(name="judge", project="p")
    judge.inference_model_name = "gpt-x"
    assert judge.get_inference_name() == "gpt-x"


def test_run_name_names_the_run_and_name_stays_the_served_alias(tmp_path: Path) -> None:
    first = policy(run_name="r2", base_path=str(tmp_path))
    second = policy(run_name="r3", base_path=str(tmp_path))
    assert (first.run_id, second.run_id) == ("p-r2", "p-r3")  # two runs: separate checkpoints
    assert first.get_inference_name() == second.get_inference_name() == "agent"
    assert first.spec.name == "agent" and first.local_log().dir == tmp_path / "p/models/r2"


def test_the_openai_client_is_made_again_when_its_endpoint_changes() -> None:
    model = art.Model(name="baseline", inference_base_url="http://127.0.0.1:1/v1")
    first = model.openai_client()
    assert model.openai_client() is first
    model.inference_base_url = "http://127.0.0.1:2/v1"
    assert str(model.openai_client().base_url) == "http://127.0.0.1:2/v1/"


def test_identity_fields_are_frozen_by_registration() -> None:
    """What ``register`` records (``_registered``) the model keeps: a later change of what is trained is refused
    at the assignment and at the next store call (a change made inside a nested object)."""
    model = policy(lora=art.LoraConfig(rank=8, alpha=16))
    model._registered = (model.run_id, model.spec)  # as register leaves it
    with pytest.raises(ModelConflictError, match=r"base_model 'smollm2-135m-instruct' -> 'other/base'"):
        model.base_model = "other/base"
    with pytest.raises(ModelConflictError, match=r"run id 'p-agent' -> 'p-agent-2'"):
        model.name = "agent-2"
    assert (model.name, model.base_model) == ("agent", "smollm2-135m-instruct")  # unchanged
    model.inference_model_name = "served-name"  # not the run's identity: set freely
    model.config.max_turns = 7  # type: ignore[union-attr]
    model.lora.rank = 4  # type: ignore[union-attr]  # nested: seen by the next store call
    with pytest.raises(ModelConflictError, match="lora"):
        model.check_identity()


# ---- the settings rule: engine and hardware accepted with one warning, what is trained mapped or refused ----
def test_engine_and_hardware_settings_are_accepted_with_one_warning_naming_the_worker_flag() -> None:
    internal = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(gpu_memory_utilization=0.775),
        engine_args=art.dev.EngineArgs(num_scheduler_steps=1, enable_sleep_mode=True, tensor_parallel_size=2),  # type: ignore[typeddict-unknown-key]
        trainer_args=art.dev.TrainerArgs(gradient_checkpointing=True, logging_steps=5),  # type: ignore[typeddict-unknown-key]
    )
    with pytest.warns(ArtSettingIgnored) as warned:
        model = art.TrainableModel(name="clue", project="p", _internal_config=internal)
    [warning] = warned  # one for the model, naming each setting and what sets it here
    assert warning.filename == __file__  # pointed at the program's line
    for part in (
        "init_args.gpu_memory_utilization=0.775 (`dgrpo worker inference --gpu-memory-utilization`)",
        "engine_args.enable_sleep_mode=True (`dgrpo worker inference --sleep-mode`)",
        "engine_args.num_scheduler_steps=1 (`dgrpo worker inference --help`)",
        "engine_args.tensor_parallel_size=2 (`dgrpo worker inference --engine vllm --tensor-parallel-size`)",
        "trainer_args.gradient_checkpointing=True",
        "trainer_args.logging_steps=5",
    ):
        assert part in str(warning.message)
    assert model.step_config(None, {}) == art.TrainableModel(name="plain").step_config(None, {})  # no effect
    with pytest.warns(ArtSettingIgnored, match="gpu_memory_utilization=0.5"):
        model._internal_config = {"init_args": {"gpu_memory_utilization": 0.5}}  # again when set again


def test_trainer_args_that_change_training_are_mapped_or_refused_saying_why() -> None:
    model = art.TrainableModel(
        name="hn",
        lora_config=art.LoRAConfig(alpha=8),
        _internal_config=art.dev.InternalModelConfig(
            trainer_args=art.dev.TrainerArgs(max_grad_norm=0.1, weight_decay=0.01)
        ),
    )
    config = model.step_config(None, {})
    assert (config.max_grad_norm, config.weight_decay) == (0.1, 0.01)  # every step's default
    assert model.step_config(art.TrainConfig(max_grad_norm=0.5), {}).max_grad_norm == 0.5  # a step's own wins
    adam = art.TrainableModel(
        name="hn", _internal_config={"trainer_args": {"optim": "adamw_torch", "adam_beta2": 0.95}}
    ).step_config(None, {})
    assert (adam.optimizer, adam.adam_beta2) == ("adamw", 0.95)  # Hugging Face's names, mapped
    for key, value, why in [
        ("optim", "sgd", "one optimizer step"),
        ("gradient_accumulation_steps", 4, "one optimizer step"),
        ("lr_scheduler_type", "cosine", "a constant schedule"),
        ("fp16", True, "fp32 or bf16"),
    ]:
        with pytest.raises(UnsupportedArtOption, match=rf"trainer_args'\]: {key}={value!r}.*{why}"):
            art.TrainableModel(name="hn", _internal_config={"trainer_args": {key: value}})
    with pytest.raises(UnsupportedArtOption, match=r"engine_args'\]: override_generation_config"):
        art.TrainableModel(name="m", _internal_config={"engine_args": {"override_generation_config": {}}})
    with pytest.raises(UnsupportedArtOption, match=r"init_args'\]: trust_remote_code=True.*operator"):
        art.TrainableModel(name="m", _internal_config={"init_args": {"trust_remote_code": True}})


def test_art_0523_train_keywords_follow_the_rule() -> None:
    fields = train_config_fields(
        "backend.train",
        {
            "learning_rate": 1e-5,
            "kl_penalty_source": "sample",  # matters only with a KL penalty, which is 0
            "optimizer_save_interval": 5,  # dgrpo keeps the optimizer state with every checkpoint
            "final_training_step": 10,
            "grad_accumulation_sequences": None,
        },
    )
    assert fields == {"learning_rate": 1e-5}
    with pytest.raises(UnsupportedArtOption, match="kl_penalty_coef"):
        train_config_fields("backend.train", {"kl_penalty_coef": 0.1, "kl_penalty_source": "sample"})
    with pytest.raises(UnsupportedArtOption, match=r"grad_accumulation_sequences=4.*one optimizer step"):
        train_config_fields("backend.train", {"grad_accumulation_sequences": 4})
