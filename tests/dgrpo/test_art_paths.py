"""The module paths ART 0.5 programs and ART's own tests import resolve to dgrpo's implementation, and
every public name of ART 0.5.18 works on ``dgrpo`` or is refused saying why (never an AttributeError)."""

from __future__ import annotations

import importlib

import pytest

import dgrpo as art
from dgrpo.errors import UnsupportedArtFeature

ART_0_5_ALL = [
    "dev", "auto_trajectory", "capture_auto_trajectory", "gather_trajectories", "gather_trajectory_groups",
    "trajectory_group_batches", "Backend", "LocalBackend", "LocalTrainResult", "LoRAConfig",
    "MegatronTopologyConfig", "ServerlessBackend", "ServerlessTrainResult", "Messages", "MessagesAndChoices",
    "Tools", "Model", "TrainableModel", "retry", "TrainSFTConfig", "TrainConfig", "TrainResult", "Trajectory",
    "TrajectoryGroup", "capture_yielded_trajectory", "yield_trajectory",
]  # fmt: skip
"""``art.__all__`` of ART 0.5.18."""

NEWER_NAMES = [
    "trajectory", "trajectory_group", "current_trajectory", "no_capture", "MetricDefinition", "get_tokenizer",
    "tokenize", "tensorize", "train_sft",
]  # fmt: skip
"""Public names of ART's main branch after 0.5 (issue 26)."""


@pytest.mark.parametrize("name", ART_0_5_ALL + NEWER_NAMES)
def test_every_public_art_name_works_or_says_why_not(name: str) -> None:
    try:
        value = getattr(art, name)
    except UnsupportedArtFeature as err:
        assert f"art.{name}: " in str(err) and "not supported" in str(err)
        assert isinstance(err, NotImplementedError) and not isinstance(err, AttributeError)
    else:
        assert value is not None


def test_refused_names_are_refused_by_from_imports_too() -> None:
    with pytest.raises(NotImplementedError, match=r"not in ART 0.5.18.* art.capture_auto_trajectory"):
        from dgrpo import current_trajectory  # noqa: F401
    with pytest.raises(NotImplementedError, match=r"call model.train_sft\(trajectories"):
        from dgrpo import train_sft  # noqa: F401
    from dgrpo import TrainSFTConfig

    assert TrainSFTConfig().model_dump() == {
        "learning_rate": 5e-5,
        "batch_size": "auto",
        "megatron_topology": None,
    }
    with pytest.raises(AttributeError):  # a name ART never had stays an ordinary AttributeError
        art.no_such_name  # noqa: B018


def test_art_module_paths_resolve_to_dgrpo() -> None:
    from dgrpo.local import LocalBackend
    from dgrpo.local.backend import LocalBackend as BackendModuleLocalBackend
    from dgrpo.metrics import MetricsBuilder, track_api_cost
    from dgrpo.metrics_taxonomy import summarize_trajectory_groups
    from dgrpo.model import Model, TrainableModel
    from dgrpo.pipeline_trainer.trainer import PipelineTrainer
    from dgrpo.utils.iterate_dataset import iterate_dataset
    from dgrpo.utils.litellm import convert_litellm_choice_to_openai
    from dgrpo.utils.strip_logprobs import strip_logprobs
    from dgrpo.utils.trajectory_logging import read_trajectory_groups_parquet, write_trajectory_groups_parquet

    assert LocalBackend is BackendModuleLocalBackend is art.LocalBackend
    assert (Model, TrainableModel) == (art.Model, art.TrainableModel)
    assert iterate_dataset is art.utils.iterate_dataset and PipelineTrainer is art.PipelineTrainer
    assert (art.metrics.MetricsBuilder, art.costs.track_api_cost) == (MetricsBuilder, track_api_cost)
    assert all(
        callable(f)
        for f in (
            convert_litellm_choice_to_openai,
            strip_logprobs,
            read_trajectory_groups_parquet,
            write_trajectory_groups_parquet,
            summarize_trajectory_groups,
        )
    )
    assert art.utils.retry is art.retry  # dgrpo.utils is a package keeping the module's names
    assert {"DatasetBatch", "epoch_order", "iterate_dataset", "retry"} <= set(vars(art.utils))


def test_lora_config_maps_to_the_lora_shape_or_is_refused() -> None:
    model = art.TrainableModel(
        name="m", project="p", lora_config=art.LoRAConfig(rank=4, alpha=8, target_modules=["q_proj"])
    )
    assert (model.spec.lora.rank, model.spec.lora.alpha, model.spec.lora.target_modules) == (4, 8, ["q_proj"])
    with pytest.raises(art.UnsupportedArtOption, match="lora_config: use_rslora=True is not supported"):
        art.TrainableModel(name="m", lora_config={"use_rslora": True})
    with pytest.raises(art.UnsupportedArtOption, match="give the LoRA shape once"):
        art.TrainableModel(name="m", lora=art.LoraConfig(rank=8), lora_config={"rank": 4})


def test_the_model_module_does_not_invent_names() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        importlib.import_module("dgrpo.model").Nope  # noqa: B018


ART_0_5_DEV_ALL = [
    "EngineArgs", "BackendModelConfig", "InternalModelConfig", "InitArgs", "LoRAConfig", "PeftArgs", "TinkerArgs",
    "TinkerNativeArgs", "TinkerTrainingClientArgs", "TrainerArgs", "get_openai_server_config", "is_dedicated_mode",
    "OpenAIServerConfig", "ServerArgs", "TrainSFTConfig", "TrainConfig", "validate_dedicated_config",
]  # fmt: skip
"""``art.dev.__all__`` of ART 0.5.18."""


@pytest.mark.parametrize("name", ART_0_5_DEV_ALL)
def test_every_name_of_art_dev_exists(name: str) -> None:
    assert name in art.dev.__all__ and getattr(art.dev, name) is not None


def test_art_dev_submodules_resolve_and_its_local_backend_helpers_are_refused_saying_why() -> None:
    from dgrpo.dev.engine import EngineArgs
    from dgrpo.dev.get_model_config import get_model_config
    from dgrpo.dev.model import InternalModelConfig
    from dgrpo.dev.openai_server import get_openai_server_config
    from dgrpo.dev.train import TrainSFTConfig
    from dgrpo.dev.validate import is_dedicated_mode, validate_dedicated_config

    assert (EngineArgs, InternalModelConfig, TrainSFTConfig) == (
        art.dev.EngineArgs,
        art.dev.InternalModelConfig,
        art.dev.TrainSFTConfig,
    )
    with pytest.raises(UnsupportedArtFeature, match=r"get_model_config: .*no dgrpo component reads"):
        get_model_config("Qwen/Qwen3-4B", "/tmp", None)
    with pytest.raises(UnsupportedArtFeature, match=r"get_openai_server_config: .*one server for all runs"):
        get_openai_server_config(model_name="m", base_model="b", log_file="/tmp/log")
    dedicated = InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[1])
    assert is_dedicated_mode(dedicated) and not is_dedicated_mode(InternalModelConfig(trainer_gpu_ids=[0]))
    validate_dedicated_config(
        InternalModelConfig(rollout_weights_mode="lora", init_args={"max_seq_length": 512})
    )
    with pytest.raises(art.UnsupportedArtOption, match=r"trainer_gpu_ids=\[0\].*workers' operator"):
        validate_dedicated_config(dedicated)
    with pytest.raises(art.UnsupportedArtOption, match=r"rollout_weights_mode='merged'"):
        validate_dedicated_config(InternalModelConfig(rollout_weights_mode="merged"))
    with pytest.raises(art.UnsupportedArtOption, match=r"tinker_args=.*hosted training service"):
        art.TrainableModel(name="m", _internal_config={"tinker_args": {"renderer_name": "qwen3"}})
