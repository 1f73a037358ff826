"""The CPU generation engine: one model, many LoRA adapters, continuous batching on one thread.

Requests from any number of HTTP handlers land in an inbox. The engine thread admits them into the
running batch between decode steps (prefilled left-padded, their KV cache left-padded into the batch's),
decodes every row one token per step in one forward pass — rows of different adapters together, through
peft's ``adapter_names`` — and drops rows as they finish. Adapters are loaded and deleted on the same
thread between steps, so no forward ever sees the model change under it.

With a prefix cache (``prefix_cache_bytes``), a finished row's keys and values are kept, and a new request
whose prompt starts with a kept sequence (the previous turn of its conversation) forwards only the rest;
requests that share a prompt (a group's rollouts) have it prefilled once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from base_models.resolve import pad_token_id
from host.cpu_share import CpuShare
from serving.kv_cache import GrowingLayer, hole_filling, new_cache, pad_left, restack
from serving.merged_lora import FoldedAdapter
from serving.prefix_cache import BLOCK, CachedSequence, PrefixCache
from serving.sampling import RowSampler, SamplingParams, sample_step

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
"""peft's name for 'no adapter' in a mixed batch."""
PREFILL_TOKENS = 16384
"""Padded prompt tokens per prefill forward; larger admissions are split."""
LINGER_STEPS = 16
"""Decode steps a finished row may keep its place in the batch (see ``_step``)."""
Hit = tuple[CachedSequence, int] | None
"""A prefix cache hit: the kept sequence and how many of the prompt's first tokens it holds."""


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


@dataclass
class _Batch:
    """The running batch: a KV cache and per-row state, all indexed by row."""

    rows: list[_Row]
    cache: DynamicCache
    mask: torch.Tensor
    lengths: torch.Tensor
    """Real (unpadded) tokens per row so far: the next token's position id."""
    last: torch.Tensor
    sampler: RowSampler
    finished: set[int] = field(default_factory=set)
    """Rows already resolved that still take their place (see ``_step``)."""
    since_finish: int = 0
    """Decode steps since the oldest of ``finished`` finished."""

    @property
    def alive(self) -> int:
        return len(self.rows) - len(self.finished)

    def compact(self) -> None:
        """Drop the finished rows."""
        if self.finished:
            _select(self, hole_filling(len(self.rows), self.finished))


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's per-layer key/value holders (``.keys``, ``.values``: batch x heads x seq x dim)."""
    return list(cache.layers)


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
    ) -> None:
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).eval()
        self.peft: torch.nn.Module | None = None
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_model_len = max_model_len or int(getattr(self.base.config, "max_position_embeddings", 4096))
        self.pad_id = pad_token_id(self.tokenizer)
        eos = self.base.generation_config.eos_token_id
        eos_ids = {*(eos if isinstance(eos, list) else [eos] if eos is not None else [])}
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(int(i) for i in eos_ids)
        self.adapter_paths: dict[str, str] = {}
        """Loaded adapters (name -> directory); changed on the engine thread only."""
        self.sleeping = False
        self.fold_adapters = fold_adapters
        """Single-adapter forwards run with the adapter folded into the base weights (serving/merged_lora.py)."""
        self._folded = FoldedAdapter(self.base)
        self._foldable: set[str] = set()
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.cpu_share = cpu_share
        """While the engine works, its share of the host's cores (host/cpu_share.py); None: all its threads."""
        if cpu_share is not None:
            cpu_share.follow(self.base)
        self._generator = torch.Generator()
        self._generator.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self._inbox: queue.Queue[_Row | _Command | None] = queue.Queue()
        self._waiting: list[_Row] = []
        self._batch: _Batch | None = None
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
                        self._decode()
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
                    self._decode()
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
        from peft import PeftModel

        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name).eval()
            else:
                self.peft.load_adapter(path, adapter_name=name)  # type: ignore[operator]
        except Exception:
            if self.peft is not None and name in self.peft.peft_config:  # type: ignore[operator]
                self.peft.delete_adapter(name)  # type: ignore[operator]  # no half-injected adapter
            raise
        self.adapter_paths[name] = path
        self._folded.refresh()
        self._folded.forget(name)
        self._foldable.discard(name)
        if self.fold_adapters and self._folded.can_fold(name):
            self._foldable.add(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(name)  # a name loaded again may hold other weights
        log.info("loaded adapter %s from %s", name, path)

    def _delete_adapter(self, name: str) -> None:
        if self.peft is not None and name in self.adapter_paths:
            self.peft.delete_adapter(name)  # type: ignore[operator]
        self.adapter_paths.pop(name, None)
        self._folded.refresh()
        self._folded.forget(name)
        self._foldable.discard(name)
        if self.prefix_cache is not None:
            self.prefix_cache.drop_adapter(name)
        log.info("unloaded adapter %s", name)

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        rows: list[_Row],
    ) -> torch.Tensor:
        inputs = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "past_key_values": cache,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        peft: Any = self.peft
        names = {r.request.adapter for r in rows}
        if peft is None or not self.adapter_paths:
            out = self.base(**inputs)
        elif names == {None}:  # base rows only: skip the adapters entirely
            with self._folded.adapters_off():
                out = self.base(**inputs)
        elif len(names) == 1:  # one adapter (the usual RL case): no per-layer mixed-batch routing
            name = names.pop()
            if name in self._foldable:  # folded into the base weights for this forward
                with self._folded.applied(name), self._folded.adapters_off():
                    out = self.base(**inputs)
            else:
                if peft.active_adapter != name:
                    peft.set_adapter(name)
                out = peft(**inputs)
        else:
            out = peft(**inputs, adapter_names=[r.request.adapter or BASE_ADAPTER for r in rows])
        return out.logits[:, -1, :]

    def _admit(self) -> None:
        free = self.max_batch - (self._batch.alive if self._batch else 0)
        if free <= 0:
            return
        admitted, self._waiting = self._waiting[:free], self._waiting[free:]
        if self.prefix_cache is not None:
            self._prefill_shared_prompts(admitted, self.prefix_cache)
        for chunk in _chunks([(row, self._cached_prefix(row)) for row in admitted]):
            try:
                self._prefill(chunk)
            except Exception as err:  # fails these requests only; the running batch is untouched
                log.exception("prefill of %d requests failed", len(chunk))
                for row, _ in chunk:
                    if not row.future.done():
                        row.future.set_exception(err)

    def _prefill(self, chunk: list[tuple[_Row, Hit]]) -> None:
        """Forward the rows' prompts (past what the prefix cache holds of them), sample their first tokens
        and merge them into the running batch."""
        rows = [row for row, _ in chunk]
        hits = [hit for _, hit in chunk]
        reused = [hit[1] if hit else 0 for hit in hits]
        suffixes = [r.request.prompt_ids[n:] for r, n in zip(rows, reused, strict=True)]
        past, width = max(reused), max(len(t) for t in suffixes)
        log.debug(
            "prefill %d requests (%d tokens wide, %d cached) into a batch of %d",
            len(rows),
            width,
            past,
            len(self._batch.rows) if self._batch else 0,
        )
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), past + width), dtype=torch.long)
        for i, (tokens, n) in enumerate(zip(suffixes, reused, strict=True)):
            ids[i, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[i, past - n : past] = 1
            mask[i, past + width - len(tokens) :] = 1
        positions = (mask.cumsum(-1) - 1)[:, past:].masked_fill(mask[:, past:] == 0, 1)
        cache = new_cache(self.base.config)
        if past > 0:
            _fill_past(cache, hits, past)
        logits = self._forward(ids, mask, positions, cache, rows)
        sampler = RowSampler.build([r.request.params for r in rows], self.eos_ids, self._generator)
        batch = _Batch(rows, cache, mask, mask.sum(-1), ids[:, -1].clone(), sampler)
        self._keep_prompts(batch, suffixes)
        self._step(batch, logits)
        if batch.alive:
            self._merge(batch)

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
            ids = torch.tensor([tokens[past:]], dtype=torch.long)
            mask = torch.ones((1, len(tokens)), dtype=torch.long)
            kv = new_cache(self.base.config)
            if past:
                _fill_past(kv, [hit], past)
            self._forward(ids, mask, torch.arange(past, len(tokens)).unsqueeze(0), kv, same[:1])
            layers = _layers(kv)
            cache.insert(
                CachedSequence(
                    adapter,
                    tokens,
                    [x.keys[0].clone() for x in layers],
                    [x.values[0].clone() for x in layers],
                )
            )

    def _keep_prompts(self, batch: _Batch, suffixes: list[list[int]]) -> None:
        """Keep the prompts just prefilled that the cache did not hold (a block or more of new tokens), so a
        request for the same prompt arriving while these rows still decode (a group's rollouts trickling in
        over HTTP) forwards only its last token, as the next turn of a conversation does."""
        seen: set[tuple[str | None, tuple[int, ...]]] = set()
        for i, (row, suffix) in enumerate(zip(batch.rows, suffixes, strict=True)):
            key = (row.request.adapter, tuple(row.request.prompt_ids))
            if len(suffix) > BLOCK and key not in seen:
                seen.add(key)
                self._keep(batch, i, row.request.prompt_ids)

    def _keep(self, batch: _Batch, i: int, tokens: list[int]) -> None:
        """Keep row ``i``'s keys and values for ``tokens`` (every token of the row forwarded so far) in the
        prefix cache."""
        if self.prefix_cache is None:
            return
        row = batch.rows[i]
        columns = batch.mask[i].nonzero().squeeze(-1)
        if len(columns) != len(tokens):  # never expected; a wrong cache would be worse than none
            log.warning("not caching a row: %d cached positions for %d tokens", len(columns), len(tokens))
            return
        layers = _layers(batch.cache)
        self.prefix_cache.insert(
            CachedSequence(
                row.request.adapter,
                tokens,
                [x.keys[i].index_select(1, columns) for x in layers],
                [x.values[i].index_select(1, columns) for x in layers],
            )
        )

    def _merge(self, new: _Batch) -> None:
        old = self._batch
        new.compact()
        if old is not None:
            old.compact()
        if old is None or not old.rows:
            self._batch = new
            return
        width = max(old.mask.shape[1], new.mask.shape[1])
        for a, b in zip(_layers(old.cache), _layers(new.cache), strict=True):
            joined = isinstance(a, GrowingLayer) and a.append_rows(b.keys, b.values)
            if not joined:
                restack(a, [(a.keys, a.values), (b.keys, b.values)], width, self.max_batch)
        old.mask = torch.cat([pad_left(old.mask, width, 1), pad_left(new.mask, width, 1)])
        old.lengths = torch.cat([old.lengths, new.lengths])
        old.last = torch.cat([old.last, new.last])
        old.rows += new.rows
        old.sampler.extend(new.sampler)

    def _decode(self) -> None:
        batch = self._batch
        assert batch is not None
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        logits = self._forward(
            batch.last.unsqueeze(1), batch.mask, batch.lengths.unsqueeze(1), batch.cache, batch.rows
        )
        batch.lengths += 1
        self._step(batch, logits)
        if not batch.alive:
            self._batch = None

    def _step(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Sample one token per row of ``batch``, record it, and resolve the rows that finished.

        A finished row leaves the batch at once where the cache moves only the rows that take its place
        (``GrowingLayer.keep_rows``): each decode step it stayed would still read its keys and values. Where
        dropping it copies every other row's cache (transformers' own layers), it keeps its place until
        the finished rows are a quarter of the batch, ``LINGER_STEPS`` after the first, or the batch merges."""
        step = sample_step(logits, batch.sampler, [len(r.tokens) for r in batch.rows])
        batch.last = torch.tensor(step.tokens, dtype=torch.long)
        for i, row in enumerate(batch.rows):
            if i in batch.finished:
                continue
            row.tokens.append(step.tokens[i])
            row.logprobs.append(step.logprobs[i])
            row.top.append(step.top[i])
            if self._finish(row, int(batch.lengths[i]) + 1):
                # its prompt and all it sampled but the last token, which was never forwarded
                self._keep(batch, i, row.request.prompt_ids + row.tokens[:-1])
                batch.finished.add(i)
        if batch.finished:
            batch.since_finish += 1
            if (
                isinstance(_layers(batch.cache)[0], GrowingLayer)
                or 4 * len(batch.finished) >= len(batch.rows)
                or batch.since_finish > LINGER_STEPS
            ):
                batch.compact()

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


def _chunks(admitted: list[tuple[_Row, Hit]]) -> list[list[tuple[_Row, Hit]]]:
    """Admitted rows in prefill batches: by the tokens each must forward (its prompt past its cache hit),
    at most ``PREFILL_TOKENS`` padded tokens a batch, and a new batch where a row must forward more than
    twice the batch's first, so a short suffix (a cache hit) is not padded to a long one (a miss)."""

    def forwarded(item: tuple[_Row, Hit]) -> int:
        row, hit = item
        return len(row.request.prompt_ids) - (hit[1] if hit else 0)

    chunks: list[list[tuple[_Row, Hit]]] = [[]]
    for item in sorted(admitted, key=forwarded):
        chunk, n = chunks[-1], forwarded(item)
        if chunk and ((len(chunk) + 1) * n > PREFILL_TOKENS or n > 2 * forwarded(chunk[0]) + BLOCK):
            chunks.append(chunk := [])
        chunk.append(item)
    return [chunk for chunk in chunks if chunk]


def _fill_past(cache: DynamicCache, hits: list[Hit], past: int) -> None:
    """Put each hit's first n keys and values, left-padded to ``past`` columns, into the empty ``cache``."""
    template = next(hit[0] for hit in hits if hit is not None)
    for layer, (keys, values) in enumerate(zip(template.keys, template.values, strict=True)):
        heads, _, dim = keys.shape
        k = keys.new_zeros((len(hits), heads, past, dim))
        v = values.new_zeros((len(hits), heads, past, dim))
        for i, hit in enumerate(hits):
            if hit is not None:
                sequence, n = hit
                k[i, :, past - n :] = sequence.keys[layer][:, :n]
                v[i, :, past - n :] = sequence.values[layer][:, :n]
        cache.update(k, v, layer)


def _select(batch: _Batch, keep: list[int]) -> None:
    """Keep only rows ``keep`` of ``batch`` (row ``j`` becomes old row ``keep[j]``, see ``hole_filling``), and
    drop the cache columns no remaining row attends to."""
    batch.finished, batch.since_finish = set(), 0
    batch.rows = [batch.rows[i] for i in keep]
    batch.sampler.select(keep)
    if not keep:
        return
    index = torch.tensor(keep, dtype=torch.long)
    batch.mask, batch.lengths, batch.last = batch.mask[index], batch.lengths[index], batch.last[index]
    used = batch.mask.any(dim=0).nonzero()
    start = int(used[0]) if len(used) else 0
    batch.mask = batch.mask[:, start:]
    for layer in _layers(batch.cache):
        if isinstance(layer, GrowingLayer):
            layer.keep_rows(keep, start)
        else:
            layer.batch_select_indices(index)
            layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
