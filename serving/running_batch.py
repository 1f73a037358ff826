"""The CPU engine's running batch: its rows, their rows of the KV cache, the columns each attends to and the
tokens each forwards in the next step. Rows join with the keys and values of their cached prefix, and leave
in place (serving/kv_cache.py).

A row's cache columns are right-aligned with every other row's: the step's last column holds each row's
newest token. A joining row takes the columns of its cached prefix and, after them, one column for each of
its new tokens but the last (the step writes them; see serving/ragged.py), left-padded to the batch's width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from serving.kv_cache import GrowingLayer, hole_filling, new_cache, pad_left, restack
from serving.prefix_cache import CachedSequence
from serving.sampling import RowSampler

Row = TypeVar("Row")
Hit = tuple[CachedSequence, int] | None
"""A prefix cache hit: the kept sequence and how many of the prompt's first tokens it holds."""


@dataclass
class Joining(Generic[Row]):
    """Rows about to join a batch, with their cache rows."""

    rows: list[Row]
    blocks: list[tuple[torch.Tensor, torch.Tensor]]
    """Per layer (keys, values), rows x heads x columns x dim: each row's cached prefix, then zeros."""
    mask: torch.Tensor
    starts: torch.Tensor
    """Each row's first new token's position: the length of its cached prefix."""
    pending: list[list[int]]
    sampler: RowSampler

    @classmethod
    def build(
        cls, config: Any, dtype: torch.dtype, rows: list[Row], hits: list[Hit], pending: list[list[int]],
        sampler: RowSampler,
    ) -> Joining[Row]:  # fmt: skip
        """``rows`` (a model of ``config``) with the prefixes ``hits`` hold, bringing ``pending`` tokens."""
        cached = [hit[1] if hit else 0 for hit in hits]
        widths = [n + len(new) - 1 for n, new in zip(cached, pending, strict=True)]
        width = max(widths)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, w in enumerate(widths):
            mask[i, width - w :] = True
        heads = config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        blocks = []
        for layer in range(config.num_hidden_layers):
            keys = torch.zeros((len(rows), heads, width, dim), dtype=dtype)
            values = torch.zeros_like(keys)
            for i, (hit, w) in enumerate(zip(hits, widths, strict=True)):
                if hit is not None:
                    sequence, n = hit
                    keys[i, :, width - w : width - w + n] = sequence.keys[layer][:, :n]
                    values[i, :, width - w : width - w + n] = sequence.values[layer][:, :n]
            blocks.append((keys, values))
        return cls(rows, blocks, mask, torch.tensor(cached, dtype=torch.long), pending, sampler)


@dataclass
class RunningBatch(Generic[Row]):
    """The rows being generated, all indexed alike."""

    rows: list[Row]
    layers: list[Any]
    """The cache's layers, one per decoder layer (``GrowingLayer``: rows x heads x columns x dim)."""
    mask: torch.Tensor
    """(rows, columns) bool: the cache columns each row attends to."""
    lengths: torch.Tensor
    """Tokens per row in the cache so far: the position id of its next new token."""
    pending: list[list[int]]
    """The tokens each row forwards in the next step: a joining row's prompt past its cached prefix, then
    the token it sampled last."""
    sampler: RowSampler

    @classmethod
    def start(cls, config: Any, joining: Joining[Row], capacity: int) -> RunningBatch[Row]:
        """A batch of ``joining``'s rows, its cache storage room for ``capacity`` rows."""
        layers: list[Any] = list(new_cache(config).layers)
        for layer, block in zip(layers, joining.blocks, strict=True):
            restack(layer, [block], joining.mask.shape[1], capacity)
        return cls(joining.rows, layers, joining.mask, joining.starts, joining.pending, joining.sampler)

    def join(self, joining: Joining[Row], capacity: int) -> None:
        """Add ``joining``'s rows after this batch's (into spare storage where there is room)."""
        width = max(self.mask.shape[1], joining.mask.shape[1])
        for layer, (keys, values) in zip(self.layers, joining.blocks, strict=True):
            if not (isinstance(layer, GrowingLayer) and layer.append_rows(keys, values)):
                restack(layer, [(layer.keys, layer.values), (keys, values)], width, capacity)
        self.mask = torch.cat([pad_left(self.mask, width, 1), pad_left(joining.mask, width, 1)])
        self.lengths = torch.cat([self.lengths, joining.starts])
        self.pending += joining.pending
        self.rows += joining.rows
        self.sampler.extend(joining.sampler)

    def open_column(self) -> None:
        """Make room in the mask for the step's newest token of every row (the step writes its keys)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)

    def forwarded(self) -> None:
        """The step forwarded every row's pending tokens."""
        self.lengths += torch.tensor([len(p) for p in self.pending], dtype=torch.long)

    def row_cache(self, i: int, tokens: int) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Copies of row ``i``'s keys and values (per layer: heads x columns x dim), which must hold ``tokens``
        tokens; None when they do not."""
        columns = self.mask[i].nonzero().squeeze(-1)
        if len(columns) != tokens:
            return None
        first, last = int(columns[0]), int(columns[-1]) + 1

        def copy(t: torch.Tensor) -> torch.Tensor:
            return t[:, first:last].clone() if last - first == tokens else t.index_select(1, columns)

        return [copy(x.keys[i]) for x in self.layers], [copy(x.values[i]) for x in self.layers]

    def drop(self, finished: set[int]) -> None:
        """Drop rows ``finished``: the last rows move into their places (``hole_filling``), and the cache
        columns no remaining row attends to go."""
        keep = hole_filling(len(self.rows), finished)
        self.rows = [self.rows[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        self.sampler.select(keep)
        if not keep:
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.mask, self.lengths = self.mask[index], self.lengths[index]
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        self.mask = self.mask[:, start:]
        for layer in self.layers:
            if isinstance(layer, GrowingLayer):
                layer.keep_rows(keep, start)
            else:
                layer.batch_select_indices(index)
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
