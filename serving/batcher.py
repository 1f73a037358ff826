"""The CPU generation engine: one model, many LoRA adapters, continuous batching on one thread.

Requests from any number of HTTP handlers land in an inbox. The engine thread admits them into the
running batch between steps, and each step is one forward (serving/ragged.py) of every running row's next
token together with the prompts of the rows that just joined — rows of different adapters together, through
peft's ``adapter_names`` — after which each row samples a token, and rows that finish leave the batch.
Adapters are loaded and deleted on the same thread between steps, so no forward ever sees the model change
under it. Llama-shaped decoders only (``ragged.MODEL_TYPES``); other models are served by vLLM.

With a prefix cache (``prefix_cache_bytes``), a finished row's keys and values are kept, and a new request
whose prompt starts with a kept sequence (the previous turn of its conversation) forwards only the rest;
requests that share a prompt (a group's rollouts) have it prefilled once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from host.cpu_share import CpuShare
from schemas.errors import UnsupportedModelError
from serving import ragged
from serving.adapter_slots import AdapterSlots
from serving.merged_lora import FoldedAdapter
from serving.packed_linear import pack_linears
from serving.prefix_cache import BLOCK, CachedSequence, PrefixCache
from serving.ragged import Feed
from serving.running_batch import Hit, Joining, RunningBatch
from serving.sampling import RowSampler, SamplingParams, sample_rows_alone, sample_step

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""peft's name for 'no adapter' in a mixed batch."""
STEP_TOKENS = 16384
"""Prompt tokens that may join the batch in one step; more requests wait for the next (one always joins)."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    adapter: str | None
    """A loaded adapter's name, or None for the base model."""
    params: SamplingParams


@dataclass
class Completion:
    token_ids: list[int]
    """Every sampled token, the EOS or stop token included."""
    logprobs: list[float]
    """Raw-distribution logprob of each sampled token (fp32 log_softmax of the logits)."""
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: Literal["stop", "length"]


@dataclass
class _Row:
    request: GenerationRequest
    future: concurrent.futures.Future[Completion]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)


Action = Literal["load", "unload", "sleep", "wake_up"]


@dataclass
class _Command:
    action: Action
    future: concurrent.futures.Future[None]
    name: str = ""
    path: str = ""


class GenerationEngine:
    """Loads ``model_path`` and serves generation requests from any thread or event loop."""

    def __init__(
        self,
        model_path: str,
        dtype: Literal["fp32", "bf16"] = "fp32",
        max_batch: int = 32,
        batch_window_s: float = 0.02,
        max_model_len: int | None = None,
        prefix_cache_bytes: int = 0,
        fold_adapters: bool = True,
        cpu_share: CpuShare | None = None,
        pack_weights: bool = True,
    ) -> None:
        reason = ragged.unsupported(AutoConfig.from_pretrained(model_path))
        if reason is not None:
            raise UnsupportedModelError(
                f"the CPU engine cannot serve {model_path}: {reason}; serve it with vLLM (--engine vllm)"
            )
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).eval()
        if pack_weights:  # oneDNN matmuls on packed weights (serving/packed_linear.py)
            pack_linears(self.base)
        self.peft: torch.nn.Module | None = None
        self._slots = AdapterSlots(self.base)
        """Each loaded adapter's peft adapter (serving/adapter_slots.py: reused by the next of its shape)."""
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_model_len = max_model_len or int(getattr(self.base.config, "max_position_embeddings", 4096))
        eos = self.base.generation_config.eos_token_id
        eos_ids = {*(eos if isinstance(eos, list) else [eos] if eos is not None else [])}
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(int(i) for i in eos_ids)
        self.vocab_size = int(self.base.config.vocab_size)
        """Logits per position: token ids a request names (stop ids, a logit bias) must be below it."""
        self.adapter_paths: dict[str, str] = {}
        """Loaded adapters (name -> directory); changed on the engine thread only."""
        self.sleeping = False
        self.fold_adapters = fold_adapters
        """Single-adapter forwards run with the adapter folded into the base weights (serving/merged_lora.py)."""
        self._folded = FoldedAdapter(self.base)
        self._foldable: set[str] = set()
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.cpu_share = cpu_share
        """While the engine works, its share of the host's cores (host/cpu_share.py), re-taken before each
        decoder layer; None: all its threads."""
        self._generator = torch.Generator()
        self._generator.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self._inbox: queue.Queue[_Row | _Command | None] = queue.Queue()
        self._waiting: list[_Row] = []
        self._batch: RunningBatch[_Row] | None = None
        self._thread = threading.Thread(target=self._run, name="generation-engine", daemon=True)
        self._thread.start()

    # ---- the API other threads call ---------------------------------------------------------------
    def submit(self, requests: list[GenerationRequest]) -> list[concurrent.futures.Future[Completion]]:
        """Queue requests for the engine thread; each future resolves when its completion is done."""
        rows = [_Row(r, concurrent.futures.Future()) for r in requests]
        for row in rows:
            self._inbox.put(row)
        return [row.future for row in rows]

    async def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in self.submit(requests))))

    def command(self, action: Action, name: str = "", path: str = "") -> concurrent.futures.Future[None]:
        """Queue an adapter load/unload or sleep/wake for the engine thread (run between decode steps)."""
        command = _Command(action, concurrent.futures.Future(), name, path)
        self._inbox.put(command)
        return command.future

    async def control(self, action: Action, name: str = "", path: str = "") -> None:
        await asyncio.wrap_future(self.command(action, name, path))

    def alive(self) -> bool:
        """False once the engine thread has ended (closed, or killed by an error): ``/health`` then says 503."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # ---- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                idle = not self._has_work()
                if idle and self.cpu_share is not None:
                    self.cpu_share.leave()
                items = self._take(block=idle)
                if items is None:
                    break
                if self.cpu_share is not None and (items or self._has_work()):
                    self.cpu_share.enter()  # an adapter load (folding) works the cores too
                    self.cpu_share.apply()
                for item in items:
                    if isinstance(item, _Command):
                        self._execute(item)
                    else:
                        self._waiting.append(item)
                try:
                    if self._waiting and not self.sleeping:
                        self._admit()
                    if self._batch is not None:
                        self._advance()
                except Exception as err:  # a failed forward fails its rows, never the engine
                    log.exception("generation failed; failing the batch's requests")
                    rows = (self._batch.rows if self._batch else []) + self._waiting
                    self._batch, self._waiting = None, []
                    for row in rows:
                        if not row.future.done():
                            row.future.set_exception(err)
        for row in (self._batch.rows if self._batch else []) + self._waiting:
            if not row.future.done():
                row.future.set_exception(RuntimeError("the generation engine stopped"))

    def _has_work(self) -> bool:
        return self._batch is not None or bool(self._waiting and not self.sleeping)

    def _take(self, block: bool) -> list[_Row | _Command] | None:
        items: list[_Row | _Command | None] = []
        if block:
            items.append(self._inbox.get())
            # An idle engine collects a burst of requests until the inbox is quiet for one window (at most
            # ten), so they share one prefill and finish together instead of trickling into the batch.
            deadline = time.monotonic() + 10 * self.batch_window_s
            while isinstance(items[-1], _Row) and len(items) < self.max_batch and time.monotonic() < deadline:
                try:
                    items.append(self._inbox.get(timeout=self.batch_window_s))
                except queue.Empty:
                    break
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        if any(item is None for item in items):
            return None
        return [item for item in items if item is not None]

    def _execute(self, command: _Command) -> None:
        try:
            if command.action == "load":
                self._load_adapter(command.name, command.path)
            elif command.action == "unload":
                self._delete_adapter(command.name)
            elif command.action == "sleep":
                while self._batch is not None:  # finish in-flight rows first, admit no new ones
                    self._advance()
                self.sleeping = True
                self._folded.forget()
                if self.prefix_cache is not None:
                    self.prefix_cache.clear()
                gc.collect()
            else:
                self.sleeping = False
        except Exception as err:
            command.future.set_exception(err)
        else:
            command.future.set_result(None)

    def _load_adapter(self, name: str, path: str) -> None:
        if self._slots.load(name, path):
            self._folded.refresh()
        self.peft = self._slots.peft
        slot = self._slots.slot(name)
        self.adapter_paths[name] = path
        self._folded.forget(slot)  # a reused slot holds other weights now
        self._foldable.discard(name)
        if self.fold_adapters and self._folded.can_fold(slot):
            self._foldable.add(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(name)  # a name loaded again may hold other weights
        log.info("loaded adapter %s from %s (%s)", name, path, slot)

    def _delete_adapter(self, name: str) -> None:
        if name in self.adapter_paths:
            self._folded.forget(self._slots.slot(name))
            if self._slots.unload(name):
                self._folded.refresh()
        self.adapter_paths.pop(name, None)
        self._foldable.discard(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(name)
        log.info("unloaded adapter %s", name)

    def _route(self, rows: list[_Row]) -> tuple[contextlib.AbstractContextManager[Any], bool]:
        """How the model runs for ``rows``: the context to forward in, and whether rows mix adapters
        (then each token carries its adapter's slot to peft's layers)."""
        peft: Any = self.peft
        names = {r.request.adapter for r in rows}
        if peft is None or not self.adapter_paths:
            return contextlib.nullcontext(), False
        if names == {None}:  # base rows only: skip the adapters entirely
            return self._folded.adapters_off(), False
        if len(names) > 1:
            return contextlib.nullcontext(), True
        name = names.pop()
        assert name is not None
        slot = self._slots.slot(name)
        if name in self._foldable:  # one adapter (the usual RL case), folded into the base weights
            stack = contextlib.ExitStack()
            stack.enter_context(self._folded.applied(slot))
            stack.enter_context(self._folded.adapters_off())
            return stack, False
        if peft.active_adapter != slot:
            peft.set_adapter(slot)
        return contextlib.nullcontext(), False

    def _forward(
        self,
        rows: list[_Row],
        layers: list[Any],
        pending: list[list[int]],
        starts: list[int],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One ragged step (serving/ragged.py) of ``rows``: each forwards its ``pending`` tokens from position
        ``starts``; the logits of each row's last token."""
        context, mixed = self._route(rows)
        slot = self._slots.slot
        names = (
            [slot(r.request.adapter) if r.request.adapter else BASE_ADAPTER for r in rows] if mixed else None
        )
        feed = Feed.build(pending, starts, mask, names)
        before_layer = self.cpu_share.at_layer if self.cpu_share is not None else None
        with context:
            return ragged.forward(self.base, layers, feed, before_layer)

    def _admit(self) -> None:
        """Join waiting rows to the running batch, as many as it has room for and at most ``STEP_TOKENS``
        new tokens in all (at least one row): the next step forwards their prompts past what the prefix cache
        holds of them, together with the running rows' next tokens."""
        free = self.max_batch - (len(self._batch.rows) if self._batch else 0)
        admitted: list[_Row] = []
        budget = STEP_TOKENS
        while self._waiting and len(admitted) < free:
            if admitted and len(self._waiting[0].request.prompt_ids) > budget:
                break
            row = self._waiting.pop(0)
            problem = row.request.params.problem(self.vocab_size)
            if problem is not None:  # a row that cannot be sampled fails alone, before it joins
                row.future.set_exception(ValueError(f"{problem[0]}: {problem[1]}"))
                continue
            admitted.append(row)
            budget -= len(row.request.prompt_ids)
        if not admitted:
            return
        try:
            self._join(admitted)
        except BaseException as err:  # rows taken from the queue and in no batch yet: only here to fail them
            for row in admitted:
                if not row.future.done():
                    row.future.set_exception(err)
            raise

    def _join(self, admitted: list[_Row]) -> None:
        """Prefill what ``admitted`` rows need and join them to the running batch (or start it)."""
        if self.prefix_cache is not None:
            self._prefill_shared_prompts(admitted, self.prefix_cache)
        hits = [self._cached_prefix(row) for row in admitted]
        pending = [
            row.request.prompt_ids[hit[1] if hit else 0 :] for row, hit in zip(admitted, hits, strict=True)
        ]
        log.debug(
            "%d requests join a batch of %d (%d new tokens, %d cached)",
            len(admitted),
            len(self._batch.rows) if self._batch else 0,
            sum(len(p) for p in pending),
            sum(hit[1] for hit in hits if hit),
        )
        sampler = RowSampler.build([r.request.params for r in admitted], self.eos_ids, self._generator)
        joining = Joining.build(self.base.config, self.base.dtype, admitted, hits, pending, sampler)
        if self._batch is None:
            self._batch = RunningBatch.start(self.base.config, joining, self.max_batch)
        else:
            self._batch.join(joining, self.max_batch)

    def _advance(self) -> None:
        """One step of the running batch: forward every row's pending tokens, sample each row's next token."""
        batch = self._batch
        assert batch is not None
        batch.open_column()
        logits = self._forward(batch.rows, batch.layers, batch.pending, batch.lengths.tolist(), batch.mask)
        batch.forwarded()
        self._keep_prompts(batch)
        self._step(batch, logits)
        if not batch.rows:
            self._batch = None

    def _cached_prefix(self, row: _Row) -> Hit:
        if self.prefix_cache is None:
            return None
        return self.prefix_cache.lookup(row.request.adapter, row.request.prompt_ids)

    def _prefill_shared_prompts(self, rows: list[_Row], cache: PrefixCache) -> None:
        """Prompts that several admitted rows share (a group's rollouts), and the cache does not hold yet,
        are forwarded once and kept, so each row forwards only its last prompt token. A prompt forwards only
        what the cache does not hold of it: the groups of one step share their system prompt and tools, so
        every group after the first (and every group of a later step) forwards little more than its
        question."""
        counts: dict[tuple[str | None, tuple[int, ...]], list[_Row]] = {}
        for row in rows:
            counts.setdefault((row.request.adapter, tuple(row.request.prompt_ids)), []).append(row)
        for (adapter, prompt), same in counts.items():
            tokens = list(prompt[:-1])
            if len(same) < 2 or not tokens:
                continue
            hit = cache.lookup(adapter, list(prompt))
            past = hit[1] if hit is not None else 0
            if past >= len(tokens):
                continue
            sampler = RowSampler.build([same[0].request.params], self.eos_ids, self._generator)
            joining = Joining.build(
                self.base.config, self.base.dtype, same[:1], [hit], [tokens[past:]], sampler
            )
            prompt_batch = RunningBatch.start(self.base.config, joining, 1)
            prompt_batch.open_column()
            self._forward(same[:1], prompt_batch.layers, [tokens[past:]], [past], prompt_batch.mask)
            kept = prompt_batch.row_cache(0, len(tokens))
            assert kept is not None
            cache.insert(CachedSequence(adapter, tokens, *kept))

    def _keep_prompts(self, batch: RunningBatch[_Row]) -> None:
        """Keep the prompts just forwarded that the cache did not hold (a block or more of new tokens), so a
        request for the same prompt arriving while these rows still decode (a group's rollouts trickling in
        over HTTP) forwards only its last token, as the next turn of a conversation does."""
        seen: set[tuple[str | None, tuple[int, ...]]] = set()
        for i, (row, new) in enumerate(zip(batch.rows, batch.pending, strict=True)):
            if row.tokens or len(new) <= BLOCK:  # past its prompt, or the cache held all but a block of it
                continue
            key = (row.request.adapter, tuple(row.request.prompt_ids))
            if key not in seen:
                seen.add(key)
                self._keep(batch, i, row.request.prompt_ids)

    def _keep(self, batch: RunningBatch[_Row], i: int, tokens: list[int]) -> None:
        """Keep row ``i``'s keys and values for ``tokens`` (every token of the row forwarded so far) in the
        prefix cache."""
        if self.prefix_cache is None:
            return
        kept = batch.row_cache(i, len(tokens))
        if kept is None:  # never expected; a wrong cache would be worse than none
            log.warning("not caching a row: its cached positions are not its %d tokens", len(tokens))
            return
        self.prefix_cache.insert(CachedSequence(batch.rows[i].request.adapter, tokens, *kept))

    def _step(self, batch: RunningBatch[_Row], logits: torch.Tensor) -> None:
        """Sample one token per row of ``batch``, record it, resolve the rows that finished and drop them from
        the batch (the cache moves only the rows that take their places, ``GrowingLayer.keep_rows``)."""
        n_generated = [len(r.tokens) for r in batch.rows]
        failed: dict[int, BaseException] = {}
        try:
            step = sample_step(logits, batch.sampler, n_generated)
        except Exception:  # one row's parameters broke the step: each row samples alone, only its own fails
            log.exception("sampling a batch of %d rows failed; sampling each row alone", len(batch.rows))
            step, failed = sample_rows_alone(logits, batch.sampler, n_generated)
        finished: set[int] = set()
        for i, row in enumerate(batch.rows):
            if i not in failed:
                row.tokens.append(step.tokens[i])
                row.logprobs.append(step.logprobs[i])
                row.top.append(step.top[i])
                batch.pending[i] = [step.tokens[i]]
                try:
                    if not self._finish(row, int(batch.lengths[i]) + 1):
                        continue
                except Exception as err:
                    log.exception("finishing a row failed; failing its request alone")
                    failed[i] = err
                else:
                    # its prompt and all it sampled but the last token, which was never forwarded
                    self._keep(batch, i, row.request.prompt_ids + row.tokens[:-1])
            if i in failed and not row.future.done():
                row.future.set_exception(failed[i])
            finished.add(i)
        if finished:
            batch.drop(finished)

    def _finish(self, row: _Row, context: int) -> bool:
        """Resolve ``row``'s future when it is done; True when it was."""
        params = row.request.params
        token = row.tokens[-1]
        reason: Literal["stop", "length"] | None = None
        text: str | None = None
        ends = params.stop_token_ids if params.ignore_eos else (*self.eos_ids, *params.stop_token_ids)
        if token in ends and len(row.tokens) > params.min_tokens:
            reason = "stop"
        elif params.stop:
            window = row.tokens[-(max(len(s) for s in params.stop) + 4) :]
            tail = str(self.tokenizer.decode(window, skip_special_tokens=True))
            if any(s in tail for s in params.stop):
                text = str(self.tokenizer.decode(row.tokens, skip_special_tokens=True))
                hits = [text.find(s) for s in params.stop if s in text]
                text = text[: min(hits)] if hits else text
                reason = "stop"
        if reason is None and (len(row.tokens) >= params.max_tokens or context >= self.max_model_len):
            reason = "length"
        if reason is None:
            return False
        if text is None:
            text = str(self.tokenizer.decode(row.tokens, skip_special_tokens=True))
        row.future.set_result(Completion(row.tokens, row.logprobs, row.top, text, reason))
        return True
