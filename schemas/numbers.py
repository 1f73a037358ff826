"""Numbers a run spec or a request may carry, bounded by what their consumers take.

Pydantic lets ``inf`` and ``nan`` through a ``float`` field (``1e999`` in JSON, ``inf`` in TOML) and any size
through an ``int``; a value a consumer cannot take (an optimizer, ``torch.manual_seed``, vLLM, a ``timedelta``)
would fail later, far from the field that caused it. Every model here refuses non-finite floats
(``allow_inf_nan=False`` in its config) and bounds every number on both sides.
"""

from __future__ import annotations

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""A sampling request's ``seed``: vLLM's range, a signed 64-bit integer (our CPU server takes the same)."""
RUN_SEED_MAX = 2**32 - 1
"""A run's seeds (scenario order, adapter init, sampling): NumPy's range, the narrowest of their consumers;
what a workflow derives from one (seed + 7919 x resample) stays far inside ``SEED_MAX``."""
