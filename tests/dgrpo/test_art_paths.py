"""The module paths ART 0.5 programs and ART's own tests import resolve to dgrpo's implementation, and
every public name of ART 0.5.18 works on ``dgrpo`` or is refused saying why (never an AttributeError)."""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
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
        assert isinstance(err, NotImplementedError)
        # feature detection as on ART without the name: no attribute, no exception
        assert isinstance(err, AttributeError) and not hasattr(art, name) and getattr(art, name, None) is None
    else:
        assert value is not None and hasattr(art, name)


def test_refused_names_are_refused_by_from_imports_too() -> None:
    """A from-import of a refused name is an ImportError (Python turns the attribute's refusal into one), as
    ``from art import Name`` is where ART lacks the name; ``art.Name`` says why."""
    with pytest.raises(ImportError, match=r"cannot import name 'tokenize'"):
        from dgrpo import tokenize  # noqa: F401
    with pytest.raises(NotImplementedError, match=r"exact token ids its server returned"):
        art.tokenize  # noqa: B018
    with pytest.raises(NotImplementedError, match=r"call model.train_sft\(trajectories"):
        art.train_sft  # noqa: B018
    from dgrpo import TrainSFTConfig

    assert TrainSFTConfig().model_dump() == {
        "learning_rate": 5e-5,
        "batch_size": "auto",
        "assistant_turns": "all",  # ART 0.5.23's
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


REFUSED_PATHS = [
    ("serverless", "serverless.backend", "TemporalBackend on your cluster"),
    ("tinker", "tinker.renderers", "hosted training services"),
    ("tinker_native", "tinker_native.backend", "hosted training services"),
    ("utils.deploy_model", "utils.deploy_model", "runs/<run id>/checkpoints/<step>/"),
    ("utils.s3", "utils.s3", "_experimental_push_to_s3(model)"),
    ("utils.s3_checkpoint_utils", "utils.s3_checkpoint_utils", "in the object store"),
    ("local.checkpoints", "local.checkpoints", "model.delete_checkpoints"),
    ("local.service", "local.service", "dgrpo worker trainer"),
    ("local.adapter_leases", "local.adapter_leases", "model.get_inference_name(step)"),
    ("adapter_leases", "adapter_leases", "model.get_inference_name(step)"),
    ("megatron", "megatron.lora", "torch + peft"),
    ("unsloth", "unsloth.service", "torch + peft"),
    ("vllm_runtime", "vllm_runtime", "one server for all runs"),
    ("weight_transfer", "weight_transfer.nccl", "reloads the LoRA adapter"),
    ("preprocessing", "preprocessing.tokenize", "its trainer builds the tensors itself"),
    ("loss", "loss", "TrainConfig.importance_sampling"),
    ("tau_bench", "tau_bench.client", "no benchmark environments"),
    ("pipeline_trainer.state", "pipeline_trainer.state", "TrainingRun workflow"),
    ("pipeline_trainer.status", "pipeline_trainer.status", "through model.log"),
]
"""(refused ART path, a module path a program imports at or under it, a phrase of the reason)."""


def test_the_refused_paths_are_the_table_and_no_module_file_answers_for_one() -> None:
    from dgrpo.art_compat.refusals import MODULES

    assert {refused for refused, _, _ in REFUSED_PATHS} == set(MODULES)
    package = Path(art.__file__).parent
    files = [
        p
        for path in MODULES
        for p in (package / f"{path.replace('.', '/')}.py", package / path.replace(".", "/"))
    ]
    assert not [str(p) for p in files if p.exists()]  # a file would be imported instead of refused


def test_from_imports_of_a_refused_path_raise_saying_why() -> None:
    with pytest.raises(ImportError, match=r"^art\.megatron: Megatron training is not supported"):
        from dgrpo import megatron  # noqa: F401
    with pytest.raises(ImportError, match=r"^art\.pipeline_trainer\.state: "):
        from dgrpo.pipeline_trainer import state  # noqa: F401


@pytest.mark.parametrize(("refused", "imported", "why"), REFUSED_PATHS)
def test_refused_art_module_paths_raise_saying_why(refused: str, imported: str, why: str) -> None:
    with pytest.raises(UnsupportedArtFeature) as raised:
        importlib.import_module(f"dgrpo.{imported}")
    assert str(raised.value).startswith(f"art.{refused}: ") and "not supported" in str(raised.value)
    assert why in str(raised.value)
    assert isinstance(raised.value, NotImplementedError) and not isinstance(raised.value, AttributeError)
    assert isinstance(raised.value, ImportError)  # a program's `except ImportError` fallback still works


def test_art_alias_refuses_the_same_paths_and_resolves_the_working_ones() -> None:
    program = """
import art
for path in ("art.serverless.backend", "art.megatron", "art.utils.deploy_model"):
    try:
        __import__(path)
    except NotImplementedError as err:
        print(str(err).split(":")[0])
from art.utils.output_dirs import get_model_dir
from art.auto_trajectory import capture_auto_trajectory
from art.backend import Backend
import art.yield_trajectory
print(art.yield_trajectory is art.capture.chat_completions.yield_trajectory, art.Backend is Backend)
"""
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests' / 'art_alias'}"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == [
        "art.serverless",
        "art.megatron",
        "art.utils.deploy_model",
        "True True",
        "",
    ]


def test_module_paths_named_as_their_function_leave_the_function_on_the_package() -> None:
    for path in ("dgrpo.auto_trajectory", "dgrpo.yield_trajectory", "dgrpo.utils.retry"):
        importlib.import_module(path)  # must not rebind the package's function of that name to the module
    from dgrpo.api_costs import track_api_cost
    from dgrpo.auto_trajectory import auto_trajectory, capture_auto_trajectory
    from dgrpo.backend import Backend
    from dgrpo.pipeline_trainer.types import EvalFn, RolloutFn
    from dgrpo.utils.retry import retry
    from dgrpo.yield_trajectory import capture_yielded_trajectory, yield_trajectory

    assert (art.auto_trajectory, art.capture_auto_trajectory) == (auto_trajectory, capture_auto_trajectory)
    assert (art.yield_trajectory, art.capture_yielded_trajectory) == (
        yield_trajectory,
        capture_yielded_trajectory,
    )
    assert art.utils.retry is retry is art.retry and art.Backend is Backend
    assert track_api_cost is art.metrics.track_api_cost
    assert (EvalFn, RolloutFn) == (
        art.pipeline_trainer.in_process.EvalFn,
        art.pipeline_trainer.in_process.GroupRollout,
    )


async def test_yield_trajectory_by_its_module_path_hands_the_trajectory_over() -> None:
    from dgrpo.yield_trajectory import capture_yielded_trajectory, yield_trajectory

    async def rollout() -> None:
        yield_trajectory(art.Trajectory(reward=0.5, messages_and_choices=[{"role": "user", "content": "hi"}]))

    assert (await capture_yielded_trajectory(rollout())).reward == 0.5


ART_0_5_UTILS_ALL = [
    "format_message", "record_provenance", "retry", "iterate_dataset", "limit_concurrency", "log_http_errors",
    "get_model_step",
]  # fmt: skip
"""``art.utils.__all__`` of ART 0.5.18."""


def test_every_name_of_art_utils_exists() -> None:
    assert set(ART_0_5_UTILS_ALL) <= set(art.utils.__all__)
    assert all(callable(getattr(art.utils, name)) for name in ART_0_5_UTILS_ALL)


async def test_limit_concurrency_runs_at_most_n_calls_per_key() -> None:
    from dgrpo.utils.limit_concurrency import limit_concurrency

    running: dict[str, int] = {}
    most: dict[str, int] = {}

    @limit_concurrency(2, derive_key=lambda key, _: key)
    async def call(key: str, i: int) -> int:
        running[key] = running.get(key, 0) + 1
        most[key] = max(most.get(key, 0), running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1
        return i

    results = await asyncio.gather(*(call(key, i) for i in range(5) for key in ("a", "b")))
    assert results == [i for i in range(5) for _ in "ab"] and most == {"a": 2, "b": 2}

    @limit_concurrency(1)
    async def single(i: int) -> int:
        running["one"] = running.get("one", 0) + 1
        most["one"] = max(most.get("one", 0), running["one"])
        await asyncio.sleep(0.01)
        running["one"] -= 1
        return i

    assert await asyncio.gather(*(single(i) for i in range(3))) == [0, 1, 2] and most["one"] == 1
    assert single.__name__ == "single"


def files_under(root: Path) -> set[str]:
    return {str(path) for path in root.rglob("*") if path.is_file()}


async def test_output_dirs_name_where_model_log_writes_and_refuse_checkpoint_dirs(tmp_path: Path) -> None:
    from dgrpo.utils import output_dirs

    model = art.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=[])
    group = art.TrajectoryGroup(
        [art.Trajectory(reward=r, messages_and_choices=[{"role": "user", "content": "q"}]) for r in (0, 1)]
    )
    await model.log([group], split="val", step=3)
    model_dir = output_dirs.get_model_dir(model, art_path=str(tmp_path))
    assert (
        model_dir
        == f"{tmp_path}/p/models/m"
        == output_dirs.get_output_dir_from_model_properties("p", "m", str(tmp_path))
    )
    assert {
        f"{model_dir}/history.jsonl",
        f"{output_dirs.get_trajectories_split_dir(model_dir, 'val')}/0003.parquet",
    } <= (files_under(tmp_path))
    assert output_dirs.get_models_dir("p", str(tmp_path)) == str(Path(model_dir).parent)
    assert output_dirs.get_default_art_path() == art.Model(name="x").base_path == ".art"
    assert output_dirs.get_model_dir(model) == ".art/p/models/m"
    with pytest.raises(UnsupportedArtFeature, match=r"get_step_checkpoint_dir: .*runs/<run id>/checkpoints"):
        output_dirs.get_step_checkpoint_dir(model_dir, 3)
    with pytest.raises(UnsupportedArtFeature, match=r"get_model_step: .*await model.get_step\(\)"):
        art.utils.get_model_step(model, str(tmp_path))
    with pytest.raises(UnsupportedArtFeature, match=r"record_provenance: dgrpo uploads no LoRA artifacts"):
        art.utils.record_provenance(None, "rl")


def test_repo_root_is_the_checkout_holding_dgrpo() -> None:
    from dgrpo.utils.get_repo_root_path import get_repo_root_path

    assert get_repo_root_path() == str(Path(art.__file__).resolve().parents[1])


def test_status_lines_are_arts(capsys: pytest.CaptureFixture[str]) -> None:
    from dgrpo.utils.logging import _C, dim, err, info, ok, step, warn

    for say, word in ((info, "a"), (step, "b"), (ok, "c"), (warn, "d"), (err, "e"), (dim, "f")):
        say(word)
    lines = capsys.readouterr().out.splitlines()
    assert [line[11:] for line in lines[:5]] == [
        f"{_C.BLUE}INFO{_C.RESET}  a",
        f"{_C.CYAN}STEP{_C.RESET}  b",
        f"{_C.GREEN}OK{_C.RESET}    c",
        f"{_C.YELLOW}WARN{_C.RESET}  d",
        f"{_C.RED}ERR{_C.RESET}   e",
    ]
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] ", lines[0][:11]) and lines[5] == f"{_C.DIM}f{_C.RESET}"


def test_format_message_as_arts() -> None:
    call = {"id": "1", "type": "function", "function": {"name": "move", "arguments": '{"x": 1}'}}
    assert art.utils.format_message({"role": "user", "content": "hi"}) == "User:\nhi\n"
    assert art.utils.format_message({"role": "assistant", "content": "ok", "tool_calls": [call, call]}) == (
        'Assistant:\nok\nmove({"x": 1})\nmove({"x": 1})'
    )
    assert art.utils.format_message({"role": "assistant", "content": None, "tool_calls": [call]}) == (
        'Assistant:\nmove({"x": 1})'
    )
    assert art.utils.format_message({"role": "assistant", "refusal": "no"}) == "Assistant:\nno\n"


async def test_log_http_errors_says_status_url_and_detail() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/json":
            return httpx.Response(404, json={"detail": "no such model"})
        return httpx.Response(500, text="<html>oops</html>")

    @art.utils.log_http_errors
    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return (await client.get(f"http://server{path}")).raise_for_status()

    with pytest.raises(Exception, match=r"^\[HTTP 404\] http://server/json no such model$") as raised:
        await get("/json")
    assert isinstance(raised.value.__cause__, httpx.HTTPStatusError)
    with pytest.raises(httpx.HTTPStatusError):  # a body that is not JSON: the error as it was
        await get("/html")
