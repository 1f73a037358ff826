"""KV caches of finished sequences, found again by token prefix: what vLLM's prefix caching does, on the CPU.

A multi-turn agent sends its whole conversation every turn, and the rollouts of one group share their prompt.
The engine keeps the keys and values it computed for each finished sequence (per adapter: an adapter's KV is
its own), and a new request whose prompt starts with a kept sequence forwards only the rest. Entries are
found by a chain of hashes over fixed-size token blocks, checked token by token, and evicted least recently
used first once their tensors pass a byte limit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK = 16
"""Tokens per hashed block: a prefix is found at block boundaries, then extended token by token."""


@dataclass
class CachedSequence:
    adapter: str | None
    tokens: list[int]
    """The tokens whose keys and values are kept, in order."""
    keys: list[torch.Tensor]
    """Per layer: heads x len(tokens) x head_dim."""
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def _block_hashes(tokens: list[int]) -> list[int]:
    """Hash of every whole-block prefix: entry k covers ``tokens[: (k + 1) * BLOCK]``."""
    out, h = [], 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, *tokens[start : start + BLOCK]))
        out.append(h)
    return out


class PrefixCache:
    """Least-recently-used KV caches of finished sequences, at most ``max_bytes`` of tensors in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[int, CachedSequence] = OrderedDict()
        self._index: dict[tuple[str | None, int], set[int]] = {}
        """(adapter, block-prefix hash) -> the entries holding that prefix (a group's rollouts share one)."""
        self._next_id = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, adapter: str | None, tokens: list[int]) -> tuple[CachedSequence, int] | None:
        """The kept sequence sharing the longest prefix with ``tokens``, and that prefix's length; at most
        ``len(tokens) - 1``, since the last prompt token must be forwarded for its logits. None when no
        whole block matches."""
        for k, h in reversed(list(enumerate(_block_hashes(tokens[:-1])))):
            matches = [(self._match(i, tokens), i) for i in self._index.get((adapter, h), ())]
            n, entry_id = max(matches, default=(0, -1))
            if n >= (k + 1) * BLOCK:  # a hash collision shows here as a shorter match
                self._entries.move_to_end(entry_id)
                self.hits += 1
                self.reused_tokens += n
                return self._entries[entry_id], n
        return None

    def _match(self, entry_id: int, tokens: list[int]) -> int:
        """Tokens ``tokens`` shares with the entry's, up to one short of all of ``tokens``."""
        kept = self._entries[entry_id].tokens
        limit, n = min(len(kept), len(tokens) - 1), 0
        while n < limit and kept[n] == tokens[n]:
            n += 1
        return n

    def insert(self, sequence: CachedSequence) -> None:
        """Keep ``sequence``; drop the kept sequences of its adapter that it extends, then the least
        recently used ones while over the byte limit."""
        if len(sequence.tokens) < BLOCK or sequence.nbytes > self.max_bytes:
            return
        for entry_id, entry in list(self._entries.items()):
            if entry.adapter == sequence.adapter and sequence.tokens[: len(entry.tokens)] == entry.tokens:
                self._remove(entry_id)
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = sequence
        self.nbytes += sequence.nbytes
        for h in _block_hashes(sequence.tokens):
            self._index.setdefault((sequence.adapter, h), set()).add(entry_id)
        while self.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def drop_adapter(self, adapter: str | None) -> None:
        """Forget every sequence computed with ``adapter`` (unloaded, or replaced by other weights)."""
        for entry_id, entry in list(self._entries.items()):
            if entry.adapter == adapter:
                self._remove(entry_id)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.nbytes -= entry.nbytes
        for h in _block_hashes(entry.tokens):
            holders = self._index.get((entry.adapter, h))
            if holders is not None:
                holders.discard(entry_id)
                if not holders:
                    del self._index[(entry.adapter, h)]
