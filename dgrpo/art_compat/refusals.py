"""The ART features dgrpo refuses, each with the reason and what to use instead: one place for the reasons
of refused top-level names (``dgrpo.UNSUPPORTED``) and of refused module paths (``MODULES``).

A refused module path has no file: ``RefusedModules``, a finder ``dgrpo/__init__.py`` appends to
``sys.meta_path``, answers for each name in ``MODULES`` that no file provides, so ``import art.serverless``,
``from dgrpo import megatron`` and ``from art.serverless.backend import ServerlessBackend`` (a module under
one) all raise ``UnsupportedArtModule`` (an ``UnsupportedArtFeature``, so a ``NotImplementedError``, and an
``ImportError``) saying ``art.serverless: <why>``. A module file of the same path wins over the table (the
finder comes after Python's own), so implementing an ART path is adding its file and deleting its line here.
Kept light: ``import dgrpo`` reads the reasons from here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import NoReturn

HOSTED = (
    "hosted training services are not supported: use dgrpo.LocalBackend, or TemporalBackend on your cluster"
)
TOKENIZING = (
    "ART 0.5.23's client-side tokenizing (TokenizedTrajectory: token ids with ART's token flags, rendered with "
    "ART's chat-template reconciliation) is not supported: dgrpo trains the exact token ids its server returned "
    "with each choice (choice.prompt_token_ids and choice.token_ids, kept in trajectory.choices() and stored "
    "with the trajectory), and its trainer builds the tensors itself"
)
MEGATRON = "Megatron training is not supported: dgrpo trains LoRA adapters with torch + peft"
CHECKPOINTS_IN_STORE = (
    "dgrpo keeps no checkpoints on the client's disk: each step's LoRA adapter is in the object store, under "
    "runs/<run id>/checkpoints/<step>/ (a train result's checkpoint_path is its URI); "
    "`await model.get_step()` is the newest step and model.delete_checkpoints(...) prunes them"
)
DEPLOY = (
    "deploying a trained adapter to a hosted service (W&B, Together) is not supported: dgrpo's server serves "
    "every step as `<name>@<step>` (model.get_inference_name(step)), and " + CHECKPOINTS_IN_STORE
)
S3_HELPERS = (
    "ART's `aws s3 sync` helpers of its local checkpoint directories are not supported: back a model up with "
    "`await backend._experimental_push_to_s3(model)` and restore it with `_experimental_pull_from_s3(model)` or "
    "`_experimental_pull_model_checkpoint(model, step=...)` (ART's layout in your bucket); "
    + CHECKPOINTS_IN_STORE
)
INFERENCE_INTERNALS = (
    "ART's vLLM process and its weight transfer are not supported: dgrpo's inference worker runs one server for "
    "all runs (its engine and flags are the operator's, `dgrpo worker inference --help`) and reloads the LoRA "
    "adapter the trainer publishes to the object store after each step"
)
ADAPTER_LEASES = (
    "pinning the step a model's requests go to (ART's backends' internal lease) is not supported, nothing in "
    "dgrpo reads it: ask for a step by name, model.get_inference_name(step) (`<name>@<step>`)"
)

MODULES = {
    "serverless": HOSTED,
    "tinker": HOSTED,
    "tinker_native": HOSTED,
    "utils.deploy_model": DEPLOY,
    "utils.s3": S3_HELPERS,
    "utils.s3_checkpoint_utils": S3_HELPERS,
    "local.checkpoints": "ART's local checkpoint directories are not supported: " + CHECKPOINTS_IN_STORE,
    "megatron": MEGATRON,
    "unsloth": "ART's Unsloth training service is not supported: dgrpo's trainer worker trains the LoRA adapter "
    "with torch + peft (`dgrpo worker trainer`)",
    "local.service": "ART's in-process model service (its trainer and vLLM in the client) is not supported: "
    "dgrpo trains and serves in workers (`dgrpo worker trainer`, `dgrpo worker inference`), which "
    "dgrpo.LocalBackend starts",
    "vllm_runtime": INFERENCE_INTERNALS,
    "weight_transfer": INFERENCE_INTERNALS,
    "adapter_leases": ADAPTER_LEASES,
    "local.adapter_leases": ADAPTER_LEASES,
    "preprocessing": TOKENIZING,
    "loss": "ART's loss on torch tensors is not supported on the client: dgrpo's loss runs in its trainer worker, "
    "chosen by TrainConfig.importance_sampling (backend.train(model, groups, loss_fn='cispo' or 'ppo'))",
    "tau_bench": "ART's tau-bench environment client and rollout are not supported: dgrpo ships no benchmark "
    "environments; write the rollout against the environment with model.openai_client()",
    "pipeline_trainer.state": "ART's PipelineTrainer's shared in-memory state is not supported: dgrpo's "
    "PipelineTrainer keeps its state in its durable TrainingRun workflow; read a run's progress with "
    "`await model.get_step()` and its metrics with model.log's files",
    "pipeline_trainer.status": "ART's PipelineTrainer's terminal status line is not supported: dgrpo's "
    "PipelineTrainer logs its steps (Python logging) and each step's numbers through model.log",
}
"""ART module paths (after ``art.``) dgrpo refuses, with the reason; a module under one is refused with it.
tests/dgrpo/test_art_paths.py imports each of them."""


def refuse_module(module_name: str) -> NoReturn:
    """Raise ``UnsupportedArtModule`` (an ``UnsupportedArtFeature``) for the refused module ``module_name``
    (``dgrpo.X`` or, under tests/art_alias, ``art.X``)."""
    from dgrpo.errors import UnsupportedArtModule  # here: the reasons above stay importable without pydantic

    path = module_name.split(".", 1)[1]
    raise UnsupportedArtModule(f"art.{path}: {MODULES[path]}")


class RefusedModules(MetaPathFinder, Loader):
    """Finds the refused module paths of ``package`` (``dgrpo``, also when tests/art_alias names it ``art``);
    loading one raises ``UnsupportedArtModule`` saying why."""

    def __init__(self, package: ModuleType) -> None:
        self.package = package

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        root, _, art_path = fullname.partition(".")
        if art_path not in MODULES or sys.modules.get(root) is not self.package:
            return None
        return ModuleSpec(fullname, self)

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        refuse_module(module.__name__)


def install(package: ModuleType) -> None:
    """Append ``package``'s ``RefusedModules`` to ``sys.meta_path`` (once): after Python's own finders, so a
    module file of the same path is found first."""
    if not any(isinstance(f, RefusedModules) and f.package is package for f in sys.meta_path):
        sys.meta_path.append(RefusedModules(package))
