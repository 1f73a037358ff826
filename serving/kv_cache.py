"""The engine's KV cache: transformers' ``DynamicCache`` whose layers grow into spare columns.

A ``DynamicLayer`` concatenates its whole key and value tensors with each decode step's one new column: on
the CPU that copy of every row's context, in every layer, every step, costs as much as reading the weights
once contexts reach a few hundred tokens. ``GrowingLayer`` allocates ``SPARE`` columns ahead and writes each
step's column in place, copying only when the spare columns run out; ``keys`` and ``values`` are views of the
filled columns, so everything that reads or replaces them (batch merge, row selection, the prefix cache)
works as on a ``DynamicLayer``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE = 64
"""Columns allocated ahead: a copy of the cache every ``SPARE`` decode steps instead of every step."""


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends in place (see the module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._kn = self._vn = 0  # filled columns of each (set apart: a caller replaces keys, then values)
        super().__init__(**kwargs)

    # ``keys`` / ``values``: the filled columns. Assigning a tensor (a merged batch, selected rows) makes it
    # the new storage, all of it filled; the next update regrows it with spare columns.
    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return self._k if self._k is None or self._k.dim() != 4 else self._k[:, :, : self._kn]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k, self._kn = value, _columns(value)

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return self._v if self._v is None or self._v.dim() != 4 else self._v[:, :, : self._vn]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v, self._vn = value, _columns(value)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._kn != self._vn:
            raise RuntimeError(f"cache layer holds {self._kn} key and {self._vn} value columns")
        n, added = self._kn, key_states.shape[-2]
        self._k = _room(self._k, n, key_states, n + added)
        self._v = _room(self._v, n, value_states, n + added)
        self._k[:, :, n : n + added] = key_states
        self._v[:, :, n : n + added] = value_states
        self._kn = self._vn = n + added
        return self._k[:, :, : n + added], self._v[:, :, : n + added]


def _columns(value: torch.Tensor | None) -> int:
    return value.shape[-2] if value is not None and value.dim() == 4 else 0


def _room(storage: torch.Tensor | None, filled: int, new: torch.Tensor, needed: int) -> torch.Tensor:
    """``storage`` when it holds ``needed`` columns for rows shaped like ``new``, else a larger copy of its
    ``filled`` columns."""
    if (
        storage is not None
        and storage.dim() == 4
        and storage.shape[:2] == new.shape[:2]
        and storage.shape[-2] >= needed
    ):
        return storage
    batch, heads, _, dim = new.shape
    grown = new.new_empty((batch, heads, needed + SPARE, dim))
    if filled:
        assert storage is not None
        grown[:, :, :filled] = storage[:, :, :filled]
    return grown


def new_cache(config: Any) -> DynamicCache:
    """An empty cache for a model of ``config``: growing layers where every layer is a plain
    ``DynamicLayer`` (full attention), else transformers' own layers."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache
