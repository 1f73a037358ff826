"""The engine's KV cache: transformers' ``DynamicCache`` whose layers grow into spare room.

A ``DynamicLayer`` concatenates its whole key and value tensors with each decode step's one new column: on
the CPU that copy of every row's context, in every layer, every step, costs as much as reading the weights
once contexts reach a few hundred tokens. ``GrowingLayer`` keeps its rows in larger storage and writes into
the spare room in place:

- ``SPARE`` columns ahead, for the next decode steps (a copy every ``SPARE`` steps instead of every step);
- spare rows, for requests joining the running batch (``append_rows``), and spare columns on the left, for
  joining rows whose context is longer than the batch's; a join then copies the new rows only;
- rows dropped from the batch (``keep_rows``) leave holes that the last rows move into, instead of every row
  moving up.

``keys`` and ``values`` are views of the filled rows and columns, so everything that reads or replaces them
(the prefix cache, transformers' own cache methods) works as on a ``DynamicLayer``. Those views never show
uninitialised memory (left padding is zeroed as it comes into view): the attention mask hides a padding
column, but it must still be finite.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE = 64
"""Columns allocated ahead: a copy of the cache every ``SPARE`` decode steps instead of every step."""
MARGIN = 64
"""Spare columns on the left of a rebuilt cache, for joining rows longer than the batch's context."""

Span = tuple[int, int, int]
"""Rows in use, first filled column, and one past the last filled column of a layer's storage."""


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends and admits rows in place (see the module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._kspan: Span = (0, 0, 0)  # kept apart: a caller may replace keys, then values
        self._vspan: Span = (0, 0, 0)
        super().__init__(**kwargs)

    # ``keys`` / ``values``: the filled rows and columns. Assigning a tensor makes it the new storage, all of
    # it filled; the next update regrows it with spare columns.
    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return _filled(self._k, self._kspan)

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k, self._kspan = value, _whole(value)

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return _filled(self._v, self._vspan)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v, self._vspan = value, _whole(value)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._kspan != self._vspan:
            raise RuntimeError(f"cache layer holds keys {self._kspan} and values {self._vspan}")
        rows, lo, hi = self._kspan
        batch, added = key_states.shape[0], key_states.shape[-2]
        if hi > lo and rows != batch:
            raise RuntimeError(f"cache layer holds {rows} rows; {batch} rows were added")
        if not self._fits(key_states, hi + added):
            margin = min(lo, MARGIN)
            self._k = _regrown(self._k, self._kspan, key_states, margin, hi - lo + added)
            self._v = _regrown(self._v, self._vspan, value_states, margin, hi - lo + added)
            lo, hi = margin, margin + hi - lo
        assert self._k is not None and self._v is not None
        self._k[:batch, :, hi : hi + added] = key_states
        self._v[:batch, :, hi : hi + added] = value_states
        self._kspan = self._vspan = (batch, lo, hi + added)
        return self._k[:batch, :, lo : hi + added], self._v[:batch, :, lo : hi + added]

    def _fits(self, new: torch.Tensor, needed: int) -> bool:
        """Whether both storages hold rows shaped like ``new`` up to column ``needed``."""
        return all(
            s is not None
            and s.dim() == 4
            and s.shape[0] >= new.shape[0]
            and s.shape[1] == new.shape[1]
            and s.shape[3] == new.shape[3]
            and s.shape[2] >= needed
            for s in (self._k, self._v)
        )

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Add rows (rows x heads x columns x dim, right-aligned with this layer's rows, zero-padded on the
        left to the longer context) into spare rows and left margin; False, and nothing changed, when the
        storage has no room for them."""
        if self._kspan != self._vspan or self._k is None or self._v is None:
            return False
        rows, lo, hi = self._kspan
        added, width = keys.shape[0], keys.shape[2]
        start = min(lo, hi - width)
        if start < 0 or not self._fits(keys, hi) or self._k.shape[0] < rows + added:
            return False
        for storage, new in ((self._k, keys), (self._v, values)):
            storage[:rows, :, start:lo] = 0  # the margin the rows there now expose
            storage[rows : rows + added, :, start : hi - width] = 0
            storage[rows : rows + added, :, hi - width : hi] = new
        self._kspan = self._vspan = (rows + added, start, hi)
        return True

    def keep_rows(self, keep: list[int], drop_columns: int) -> None:
        """Keep rows ``keep`` (row ``j`` becomes old row ``keep[j]``) and drop the first ``drop_columns``
        filled columns. ``keep`` must move each kept row at most once and never onto a row still to be
        moved: what ``hole_filling`` returns."""
        if self._kspan != self._vspan or self._k is None or self._v is None:
            raise RuntimeError(f"cache layer holds keys {self._kspan} and values {self._vspan}")
        _, lo, hi = self._kspan
        for j, i in enumerate(keep):
            if i != j:
                self._k[j, :, lo:hi] = self._k[i, :, lo:hi]
                self._v[j, :, lo:hi] = self._v[i, :, lo:hi]
        self._kspan = self._vspan = (len(keep), lo + drop_columns, hi)


def hole_filling(rows: int, dropped: set[int]) -> list[int]:
    """The order of the rows left when ``dropped`` leave a batch of ``rows``: each kept row stays where it
    is, except the last ones, which move into the holes the dropped rows leave."""
    kept = rows - len(dropped)
    movers = [i for i in range(kept, rows) if i not in dropped]
    return [movers.pop() if i in dropped else i for i in range(kept)]


def restack(layer: Any, blocks: list[tuple[torch.Tensor, torch.Tensor]], width: int, capacity: int) -> None:
    """Make ``layer`` hold ``blocks`` (keys and values, each rows x heads x columns x dim, in row order)
    stacked by row, right-aligned in ``width`` columns and zero-padded on the left.

    A ``GrowingLayer`` gets them in new storage, in one copy, with room for ``capacity`` rows, ``MARGIN``
    columns on the left and ``SPARE`` ahead; any other layer gets a stacked tensor of its own."""
    first = blocks[0][0]
    if not layer.is_initialized:
        layer.lazy_initialization(first, blocks[0][1])
    if not isinstance(layer, GrowingLayer):
        layer.keys = torch.cat([pad_left(k, width, 2) for k, _ in blocks])
        layer.values = torch.cat([pad_left(v, width, 2) for _, v in blocks])
        return
    rows = sum(k.shape[0] for k, _ in blocks)
    shape = (max(rows, capacity), first.shape[1], MARGIN + width + SPARE, first.shape[3])
    keys, values = first.new_empty(shape), first.new_empty(shape)
    end = MARGIN + width
    for storage, index in ((keys, 0), (values, 1)):
        start = 0
        for block in blocks:
            new = block[index]
            stop, pad = start + new.shape[0], end - new.shape[2]
            storage[start:stop, :, MARGIN:pad] = 0
            storage[start:stop, :, pad:end] = new
            start = stop
    layer._k, layer._v = keys, values
    layer._kspan = layer._vspan = (rows, MARGIN, end)


def _filled(storage: torch.Tensor | None, span: Span) -> torch.Tensor | None:
    if storage is None or storage.dim() != 4:
        return storage
    rows, lo, hi = span
    return storage[:rows, :, lo:hi]


def _whole(value: torch.Tensor | None) -> Span:
    if value is None or value.dim() != 4:
        return (0, 0, 0)
    return (value.shape[0], 0, value.shape[-2])


def _regrown(
    storage: torch.Tensor | None, span: Span, new: torch.Tensor, margin: int, columns: int
) -> torch.Tensor:
    """New storage for rows shaped like ``new``: ``margin`` columns, the filled columns of ``storage``, room
    for ``columns`` in all and ``SPARE`` more."""
    rows, lo, hi = span
    capacity = max(new.shape[0], storage.shape[0] if storage is not None and storage.dim() == 4 else 0)
    grown = new.new_empty((capacity, new.shape[1], margin + columns + SPARE, new.shape[3]))
    if hi > lo:
        assert storage is not None
        grown[:rows, :, margin : margin + hi - lo] = storage[:rows, :, lo:hi]
    return grown


def pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` left-padded with zeros to ``width`` along ``dim``."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def new_cache(config: Any) -> DynamicCache:
    """An empty cache for a model of ``config``: growing layers where every layer is a plain
    ``DynamicLayer`` (full attention), else transformers' own layers."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache
