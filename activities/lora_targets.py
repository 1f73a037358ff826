"""Which modules a run's LoRA adapter trains, per architecture."""

from __future__ import annotations

from schemas.errors import RunSpecError

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_TARGET_MODULES: dict[str, list[str]] = {
    model_type: PROJECTIONS for model_type in ("llama", "mistral", "qwen2", "qwen3")
}
"""``lora.target_modules = "all-linear"`` per ``config.model_type``: every attention and MLP projection (what
vLLM's LoRA loads for these architectures); not the LM head or the embeddings."""


def lora_target_modules(model_type: str, requested: list[str] | str, linear_names: set[str]) -> list[str]:
    """The module names the adapter trains: ``requested``, or the architecture's projections for
    ``all-linear``; an architecture without a known list, or a name the model lacks, is refused."""
    if requested == "all-linear":
        known = LORA_TARGET_MODULES.get(model_type)
        if known is None:
            raise RunSpecError(
                f"model.lora.target_modules 'all-linear' has no known meaning for model type {model_type!r} "
                f"(known: {', '.join(sorted(LORA_TARGET_MODULES))}): list the modules to adapt in "
                f"model.lora.target_modules; its linear layers are {', '.join(sorted(linear_names))}"
            )
        requested = known
    missing = [name for name in requested if name not in linear_names]
    if missing:
        raise RunSpecError(
            f"model.lora.target_modules names {', '.join(missing)}, which this {model_type} model does not "
            f"have as linear layers; it has {', '.join(sorted(linear_names))}"
        )
    return list(requested)
