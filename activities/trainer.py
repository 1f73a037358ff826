"""The LoRA policy trainer: base model + adapter kept in memory, one GRPO step per call.

``Trainer(model_spec, precision)`` loads the base model once and wraps it in a peft LoRA (``ModelSpec.lora``:
by default the attention and MLP projections of the architecture, activities/lora_targets.py; or the warm-start
adapter's own config when ``base_model`` is an adapter dir). Precision ``auto`` is bf16 on a CUDA GPU that has
it and fp32 elsewhere; ``bf16`` computes under bf16 autocast, and on a GPU also keeps the frozen base weights in
bf16 (half the memory; the LoRA weights and their optimizer stay fp32). A local ``base_model`` is read only
from under the worker's model roots (``DGRPO_MODEL_ROOTS``). Before a step, ``plan_memory`` picks the
micro-batch and gradient checkpointing from the model's size and the device's free memory
(activities/memory_plan.py). A step loads an adapter +
optimizer state (``load_state``), runs ``train_step`` and saves them (``save_state``); the activity
layer (activities/training.py) handles staging, publishing and failures. Sequences that share a prompt (a
group's rollouts) are trained as packs, the prompt forwarded once (activities/shared_prefix.py).

On CUDA with ``unsloth`` importable (``DGRPO_TRAINER_BACKEND=unsloth``, or auto when CUDA is there),
the model is loaded through unsloth's ``FastLanguageModel``; everything else is the same.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from activities import optimizers, shared_prefix
from activities import progress as stage_progress
from activities.device import default_device, free_memory_bytes, resolve_precision
from activities.grpo_loss import LossOutput, LossParams, grpo_loss, token_logprobs
from activities.lora_targets import lora_target_modules
from activities.memory_plan import MemoryPlan, model_dims, plan_micro_batch, sharding_bytes
from activities.optimizers import PAGED_ADAMW_8BIT, kind_of, runs_8bit, set_hyperparameters, state_kind
from activities.ranks import ONE_RANK, Ranks
from activities.state_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS, Snapshot, read_optimizer_state
from activities.tokenize import TrainSequence
from base_models.resolve import pad_token_id, resolve_base_model
from host.cpu_share import CpuShare
from schemas.config import ModelSpec, TrainConfig
from schemas.errors import NonFiniteUpdateError
from schemas.settings import model_roots

log = logging.getLogger(__name__)

ENV_BACKEND = "DGRPO_TRAINER_BACKEND"

Progress = Callable[[int, int, int], None]
"""``progress(micro_batch_index, n_micro_batches, micro_batch_size)`` after each micro-batch."""


@dataclass
class StepStats:
    loss: float
    policy_loss: float
    kl: float
    grad_norm: float
    mean_ratio: float
    clip_fraction: float
    n_sequences: int
    n_trainable_tokens: int
    n_tokens: int
    micro_batch_size: int


def _use_unsloth() -> bool:
    choice = os.environ.get(ENV_BACKEND, "auto")
    if choice == "torch" or not torch.cuda.is_available():
        return False
    try:
        import unsloth  # noqa: F401
    except ImportError:
        if choice == "unsloth":
            raise
        return False
    return True


def token_weights(sequences: list[TrainSequence], length_weighting: bool) -> list[list[float]]:
    """Per-token loss weights (0 off the mask); with length weighting each trajectory sums to 1."""
    per_traj: dict[int, int] = {}
    for s in sequences:
        per_traj[s.trajectory_index] = per_traj.get(s.trajectory_index, 0) + s.n_trainable
    out = []
    for s in sequences:
        w = 1.0 / per_traj[s.trajectory_index] if length_weighting else 1.0
        out.append([w if t else 0.0 for t in s.trainable])
    return out


def check_finite_update(step: int, loss: float, grad_norm: float) -> None:
    """Raise ``NonFiniteUpdateError`` unless the step's loss and gradient norm are finite: called before
    ``optimizer.step()``, so a NaN or inf never reaches the adapter (or its optimizer state)."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    raise NonFiniteUpdateError(
        f"step {step}: loss {loss!r}, gradient norm {grad_norm!r}; the update is not finite and was not "
        "applied (nothing is published). A sampling logprob far below the policy's, a huge advantage or a "
        "too-high learning_rate does this: check the step's trajectories and train config"
    )


def check_finite_adapter(directory: str | Path) -> None:
    """Raise ``NonFiniteUpdateError`` naming the first tensor of ``directory``'s adapter that holds a NaN or
    an inf (checked before a checkpoint is published)."""
    check_finite_weights(load_file(str(Path(directory) / ADAPTER_WEIGHTS)), str(directory))


def check_finite_weights(weights: dict[str, torch.Tensor], directory: str) -> None:
    """``check_finite_adapter`` of the adapter weights ``weights`` staged in ``directory``."""
    for name, tensor in weights.items():
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise NonFiniteUpdateError(
                f"{directory}: adapter tensor {name} holds {bad} NaN or infinite value(s) of {tensor.numel()}; "
                "a checkpoint with non-finite weights is never published"
            )


def peft_config(spec: ModelSpec, base: Any) -> PeftLoraConfig:
    """The run's LoRA (``spec.lora``) for ``base``: by default on every linear projection but the output one that
    the architecture's table names (activities/lora_targets.py)."""
    lora = spec.lora
    output = base.get_output_embeddings()
    linear = {
        name.rsplit(".", 1)[-1]
        for name, module in base.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    }
    model_type = str(base.config.model_type)
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft takes any number (scale = alpha / r)
        lora_dropout=lora.dropout,
        target_modules=lora_target_modules(model_type, lora.target_modules, linear),
        task_type="CAUSAL_LM",
    )


class PolicyHead(torch.nn.Module):
    """The policy's forward as one module: the decoder over a batch, then the output projection on the chosen
    positions only (as TRL's ``logits_to_keep``: prompt positions never get a ``[vocab]``-wide row). One module
    call, so FSDP (activities/gang/) can shard it as its root: the embeddings and the output projection, tied in
    Qwen3 and SmolLM2, are gathered by its own hooks."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        rows: torch.Tensor,
        columns: torch.Tensor,
    ) -> torch.Tensor:
        """The logits at ``(rows, columns)`` of the decoder's last hidden state."""
        base = self.model.get_base_model()
        hidden = base.get_decoder()(
            input_ids=ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return base.get_output_embeddings()(hidden[rows, columns])


class Trainer:
    """A base model with one trainable LoRA adapter, kept warm across steps."""

    def __init__(
        self, model: ModelSpec, precision: str = "auto", device: str | None = None, load_on: str | None = None
    ) -> None:
        """``load_on``: where the base's weights are read into (default ``device``); a rank of a gang reads them on
        the CPU, and each layer moves to its device as it is sharded (activities/gang/sharded.py)."""
        self.spec = model
        self.device = torch.device(device) if device else default_device()
        self.precision = resolve_precision(precision, self.device)
        """``fp32`` or ``bf16``: whether the forward runs under bf16 autocast."""
        resolved = resolve_base_model(model.base_model, roots=model_roots())
        self.base_path = resolved.base_path
        self.warm_start_path = resolved.adapter_path
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.base_path)
        unsloth = _use_unsloth()
        if unsloth:
            base = self._load_unsloth()
        else:
            bf16_weights = self.precision == "bf16" and self.device.type == "cuda"
            weights = torch.bfloat16 if bf16_weights else torch.float32
            base = AutoModelForCausalLM.from_pretrained(self.base_path, dtype=weights)
            base = base.to(torch.device(load_on) if load_on else self.device)  # type: ignore[arg-type]
        if self.warm_start_path is not None:
            self.model: Any = PeftModel.from_pretrained(base, self.warm_start_path, is_trainable=True)
        else:
            self.model = get_peft_model(base, self._peft_config(base))
        self.head = PolicyHead(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ranks: Ranks = ONE_RANK
        """The other ranks a step is trained with (activities/gang/); alone by default."""
        self.gradient_checkpointing = False
        """Each decoder layer recomputed in the backward pass (``use_gradient_checkpointing``)."""
        self.optimizer: torch.optim.Optimizer | None = None
        self._adapter = self._adapter_tensors()
        """The adapter's live tensors under PEFT's state-dict names: saved and loaded without PEFT's module walks."""
        with tempfile.TemporaryDirectory() as written:  # PEFT's own adapter_config.json, written once
            self.model.save_pretrained(written)
            self._adapter_config = (Path(written) / ADAPTER_CONFIG).read_text()
        # A 4D attention mask needs transformers' SDPA attention (unsloth patches attention its own way).
        self.share_prefixes = not unsloth and base.config._attn_implementation == "sdpa"
        """Sequences that share a prompt are trained as packs (activities/shared_prefix.py)."""
        self.cpu_share = CpuShare.for_host() if self.device.type == "cpu" else None
        """On a CPU, the cores a step takes while an inference server on this host works too."""
        if self.cpu_share is not None:
            self.cpu_share.follow(self.model)
        log.info(
            "trainer ready: %s (%d trainable params, warm start: %s)",
            self.base_path,
            sum(p.numel() for p in self.params),
            self.warm_start_path,
        )

    def _peft_config(self, base: Any) -> PeftLoraConfig:
        return peft_config(self.spec, base)

    def _load_unsloth(self) -> Any:
        from unsloth import FastLanguageModel

        # dtype=None means bf16 to Unsloth on a bf16-capable GPU: an fp32 trainer would train bf16 weights
        # (max |Δ logprob| 0.68 against its own sampler on the H100, 3e-5 with torch + peft).
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        model, tokenizer = FastLanguageModel.from_pretrained(self.base_path, dtype=dtype, load_in_4bit=False)
        self.tokenizer = tokenizer
        return model

    # ---- state ------------------------------------------------------------------------------------
    def init_adapter(self, seed: int) -> None:
        """The step-0 adapter: the warm-start adapter as loaded, or a fresh LoRA (B = 0) from ``seed``."""
        self.optimizer = None
        if self.warm_start_path is not None:
            weights = load_file(str(Path(self.warm_start_path) / ADAPTER_WEIGHTS))
            set_peft_model_state_dict(self.model, weights)
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self.model.modules():
                if isinstance(module, LoraLayer):
                    module.reset_lora_parameters("default", True)

    def _adapter_tensors(self) -> dict[str, torch.Tensor] | None:
        """PEFT's state dict of the adapter when its entries are the trained parameters themselves (they share
        storage), else None (then every save and load asks PEFT)."""
        state = get_peft_model_state_dict(self.model)
        trained = {p.data_ptr() for p in self.params}
        return dict(state) if all(t.data_ptr() in trained for t in state.values()) else None

    def _live_adapter(self) -> dict[str, torch.Tensor]:
        return self._adapter if self._adapter is not None else get_peft_model_state_dict(self.model)

    def load_state(self, directory: str | Path) -> None:
        """Adapter weights and (when present) optimizer state from a checkpoint dir."""
        directory = Path(directory)
        weights = load_file(str(directory / ADAPTER_WEIGHTS))
        if self._adapter is None or weights.keys() != self._adapter.keys():
            result: Any = set_peft_model_state_dict(self.model, weights)
            if result.unexpected_keys:
                raise ValueError(f"{directory}: adapter has unexpected keys {result.unexpected_keys[:3]}")
        else:
            with torch.no_grad():
                for name, tensor in weights.items():
                    self._adapter[name].copy_(tensor)
        self.optimizer = None
        state = read_optimizer_state(directory)
        if state is not None and state_kind(state) == PAGED_ADAMW_8BIT and not runs_8bit(self.device):
            log.warning(
                "%s: its 8-bit AdamW state cannot run here (no CUDA or bitsandbytes): a fresh optimizer",
                directory,
            )
        elif state is not None:
            self.optimizer = optimizers.new_optimizer(self.params, TrainConfig(), state_kind(state))
            self.optimizer.load_state_dict(state)

    def snapshot(self) -> Snapshot:
        """A copy of the adapter, the optimizer state and torch's RNG, to write while the model trains on."""
        return Snapshot.take(self._live_adapter(), self._adapter_config, self.optimizer)

    def save_state(self, directory: str | Path) -> dict[str, str]:
        """Adapter in PEFT format (adapter_config.json + safetensors), the optimizer state and torch's RNG;
        each file's sha256."""
        return self.snapshot().write(directory)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._live_adapter().items()}

    def optimizer_kind(self, config: TrainConfig) -> str:
        """The optimizer ``config`` asks for, as this trainer can run it (activities/optimizers.py)."""
        return optimizers.optimizer_kind(config, self.device)

    def new_optimizer(self, config: TrainConfig) -> torch.optim.Optimizer:
        return optimizers.new_optimizer(self.params, config, self.optimizer_kind(config))

    # ---- memory -----------------------------------------------------------------------------------
    def plan_memory(self, sequences: list[TrainSequence], requested: int) -> MemoryPlan:
        """The micro-batch (at most ``requested``) and checkpointing this step's sequences fit in now: on a rank
        of a gang, in its device's share of the free memory, less what sharding holds (memory_plan.sharding_bytes)."""
        dims = model_dims(self.model.get_base_model().config)
        optimizer_bytes = 0 if self.optimizer is not None else 12 * sum(p.numel() for p in self.params)
        weight = next(self.model.get_base_model().parameters())
        free = free_memory_bytes(self.device) // self.ranks.per_device - sharding_bytes(
            dims, weight.element_size(), optimizer_bytes, self.ranks.world_size, self.ranks.shards_base
        )
        return plan_micro_batch(
            dims,
            requested,
            tokens=max(len(s.tokens) for s in sequences),
            trained_tokens=max(s.n_trainable for s in sequences),
            free_bytes=free,
            element_bytes=2 if self.precision == "bf16" else 4,
        )

    def use_gradient_checkpointing(self, on: bool) -> None:
        """Recompute each decoder layer in the backward pass (keeping only its input) while ``on``."""
        if on == self.gradient_checkpointing:
            return
        # transformers 5.24 renames these activation_checkpointing_*; the GPU image's 5.17 has only these.
        base = self.model.get_base_model()
        if on:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_disable()
        self.gradient_checkpointing = on

    # ---- compute ----------------------------------------------------------------------------------
    def _autocast(self) -> Any:
        enabled = self.precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _batch(self, seqs: list[TrainSequence], weights: list[list[float]]) -> dict[str, torch.Tensor]:
        width = max(len(s.tokens) for s in seqs)
        pad = pad_token_id(self.tokenizer)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        old = torch.full((len(seqs), width), math.nan, dtype=torch.float32)
        w = torch.zeros((len(seqs), width), dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
        for i, (s, sw) in enumerate(zip(seqs, weights, strict=True)):
            n = len(s.tokens)
            ids[i, :n] = torch.tensor(s.tokens)
            attn[i, :n] = 1
            old[i, :n] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
            w[i, :n] = torch.tensor(sw, dtype=torch.float32)
        # Position t's logits predict token t + 1: targets, old logprobs and weights shift by one.
        batch = {"ids": ids, "attn": attn, "old": old[:, 1:], "w": w[:, 1:], "adv": adv}
        return {k: v.to(self.device) for k, v in batch.items()}

    def target_logprobs(self, ids: torch.Tensor, attn: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """``log p(ids[:, t + 1] | ids[:, : t + 1])`` where ``select[:, t]``, else 0; shape ``[B, T - 1]``.

        The vocabulary projection runs only on the selected (trainable) positions, as TRL's
        ``logits_to_keep`` does: prompt positions never get a ``[vocab]``-wide logits row.
        """
        rows, columns = select.nonzero(as_tuple=True)
        with self._autocast():
            logits = self.head(ids, attn, None, rows, columns)
        out = torch.zeros(select.shape, dtype=torch.float32, device=ids.device)
        out[select] = token_logprobs(logits, ids[:, 1:][select])
        return out

    def packed_logprobs(self, batch: shared_prefix.PackedBatch) -> torch.Tensor:
        """``log p(target)`` of each of ``batch``'s trained tokens, flattened (shape ``[tokens]``)."""
        device = self.device
        with self._autocast():
            logits = self.head(
                batch.ids.to(device),
                batch.mask.to(device),
                batch.positions.to(device),
                batch.row.to(device),
                batch.column.to(device),
            )
        return token_logprobs(logits, batch.target.to(device))

    def sequence_logprobs(self, seqs: list[TrainSequence]) -> list[list[float]]:
        """The current policy's logprob of every token after the first (no grad), per sequence."""
        batch = self._batch(seqs, [[0.0] * len(s.tokens) for s in seqs])
        with torch.no_grad():
            lp = self.target_logprobs(batch["ids"], batch["attn"], batch["attn"][:, 1:].bool())
        return [lp[i, : len(s.tokens) - 1].tolist() for i, s in enumerate(seqs)]

    def _micro_batches(
        self, sequences: list[TrainSequence], weights: list[list[float]], micro_batch_size: int
    ) -> list[Callable[[], dict[str, torch.Tensor] | shared_prefix.PackedBatch]]:
        """The step's micro-batches, built when called: packs of prompt-sharing sequences, or (without
        SDPA attention) padded rows sorted by length so they pad little. The sum over micro-batches does not
        depend on how the step is cut."""
        if self.share_prefixes:
            pad = pad_token_id(self.tokenizer)
            return [
                partial(shared_prefix.build, packs, sequences, weights, pad)
                for packs in shared_prefix.plan(sequences, micro_batch_size)
            ]
        order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i].tokens), i))
        chunks = [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
        return [partial(self._batch, [sequences[i] for i in c], [weights[i] for i in c]) for c in chunks]

    def _idle_micro_batch(
        self, sequences: list[TrainSequence], weights: list[list[float]]
    ) -> Callable[[], dict[str, torch.Tensor] | shared_prefix.PackedBatch]:
        """A micro-batch for a rank with none of its own to run (its loss is counted 0): the step's first
        sequence with a trained token."""
        first = next(i for i, s in enumerate(sequences) if any(s.trainable[1:]))
        return self._micro_batches([sequences[first]], [weights[first]], 1)[0]

    def _micro_batch_loss(
        self,
        batch: dict[str, torch.Tensor] | shared_prefix.PackedBatch,
        total_weight: float,
        params: LossParams,
    ) -> LossOutput:
        """The GRPO loss of one micro-batch (its share of the step's loss)."""
        if isinstance(batch, shared_prefix.PackedBatch):
            logprobs = self.packed_logprobs(batch)[None]
            sampled = batch.old.to(self.device)[None]
            advantages = batch.advantage.to(self.device)[None]
            token_weights = batch.weight.to(self.device)[None]
            ref = None
            if params.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref = self.packed_logprobs(batch)[None]
        else:
            select = batch["w"] > 0
            logprobs = self.target_logprobs(batch["ids"], batch["attn"], select)
            sampled, advantages, token_weights = batch["old"], batch["adv"], batch["w"]
            ref = None
            if params.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref = self.target_logprobs(batch["ids"], batch["attn"], select)
        # Unknown sampling logprobs (chat-template fallback): the current policy's, ratio 1.
        old = torch.where(torch.isnan(sampled), logprobs.detach(), sampled)
        return grpo_loss(logprobs, old, advantages, token_weights, total_weight, params, ref)

    def train_step(
        self,
        sequences: list[TrainSequence],
        config: TrainConfig,
        step: int,
        micro_batch_size: int,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> StepStats:
        """One GRPO step: ``config.epochs`` passes, each accumulating all micro-batches, then one update. On a rank
        of a gang, the micro-batches of its share of ``sequences`` (activities/ranks.py)."""
        if self.optimizer is None or kind_of(self.optimizer) != self.optimizer_kind(config):
            self.optimizer = self.new_optimizer(config)  # the first step, or another kind: a fresh state
        set_hyperparameters(self.optimizer, config)
        params = LossParams.from_config(config)
        weights = token_weights(sequences, config.length_weighting)
        total_weight = sum(sum(w) for w in weights)
        if total_weight <= 0:
            raise ValueError("no trainable tokens in this step")
        torch.manual_seed(config.seed * 1_000_003 + step)  # LoRA dropout, if any
        self.model.train()
        ranks = self.ranks
        mine = ranks.share(sequences)
        micro_batches = self._micro_batches(
            [sequences[i] for i in mine], [weights[i] for i in mine], micro_batch_size
        )
        # Every rank runs as many micro-batches (FSDP's collectives pair up rank by rank): idle ones weigh 0.
        count = ranks.most(len(micro_batches))
        idle = micro_batches[0] if micro_batches else self._idle_micro_batch(sequences, weights)
        sums = [0.0] * 5  # loss, policy, kl, ratio, clipped
        grad_norm = 0.0
        with self.cpu_share.busy() if self.cpu_share else contextlib.nullcontext():
            for _epoch in range(config.epochs):
                self.optimizer.zero_grad(set_to_none=True)
                mine_sums = [0.0] * 5
                for index in range(count):
                    if should_stop is not None and should_stop():
                        raise InterruptedError("training cancelled")
                    ranks.gradient_sync(index == count - 1)
                    if index < len(micro_batches):
                        out = self._micro_batch_loss(micro_batches[index](), total_weight, params)
                        out.loss.backward()
                        got = (float(out.loss.detach()), out.policy_loss_sum, out.kl_sum, out.ratio_sum,
                               out.clipped_tokens)  # fmt: skip
                        mine_sums = [a + b for a, b in zip(mine_sums, got, strict=True)]
                    else:
                        (self._micro_batch_loss(idle(), total_weight, params).loss * 0.0).backward()
                    stage_progress.advance()
                    if progress is not None:
                        progress(index + 1, count, micro_batch_size)
                ranks.reduce_gradients(self.params)
                grad_norm = ranks.clip_grad_norm(self.params, config.max_grad_norm)
                sums = ranks.sum(mine_sums)
                check_finite_update(step, sums[0], grad_norm)
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        n_trainable = sum(s.n_trainable for s in sequences)
        return StepStats(
            loss=sums[0],
            policy_loss=sums[1] / total_weight,
            kl=sums[2] / total_weight,
            grad_norm=grad_norm,
            mean_ratio=sums[3] / max(n_trainable, 1),
            clip_fraction=sums[4] / max(n_trainable, 1),
            n_sequences=len(sequences),
            n_trainable_tokens=n_trainable,
            n_tokens=sum(len(s.tokens) for s in sequences),
            micro_batch_size=micro_batch_size,
        )
