"""ART's ``art.utils.strip_logprobs``: a copy of a nested structure without its token logprobs, which are
most of a logged trajectory's bytes."""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger(__name__)


def strip_logprobs(obj: Any) -> Any:
    """A deep copy of ``obj`` with every ``logprobs`` dict key dropped and every ``logprobs`` attribute set to
    None, tuples kept as tuples. An object that cannot be deep-copied is returned as it is (with a warning)."""
    try:
        copied = copy.deepcopy(obj)
    except Exception as err:  # RecursionError included: the caller's object is left as it was
        log.warning(
            "Failed to deepcopy object in strip_logprobs: %s. Returning original object unchanged.", err
        )
        return obj
    return _without_logprobs(copied)


def _without_logprobs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_logprobs(v) for k, v in value.items() if k != "logprobs"}
    if isinstance(value, list):
        return [_without_logprobs(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_without_logprobs(v) for v in value)
    if hasattr(value, "__dict__"):  # a copy made above: changed in place
        for name, attribute in list(vars(value).items()):
            setattr(value, name, None if name == "logprobs" else _without_logprobs(attribute))
    return value


__all__ = ["strip_logprobs"]
