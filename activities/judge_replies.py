"""What a judge's reply says: its judgements of a group, read leniently (code fences, prose around the JSON, a
bare list of numbers) and brought to [0, 1] (``normalized``), or ``MalformedJudgement`` saying what to fix, which
goes back to the judge (activities/judge.py; dgrpo's client-side RULER, dgrpo/rewards/ruler.py)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple


class Judgement(NamedTuple):
    """The judge's verdict on one trajectory."""

    score: float
    explanation: str = ""
    """What the judge said of it (empty when its reply gave none, e.g. a bare list of scores)."""


class MalformedJudgement(ValueError):
    """The judge's reply is not the JSON asked for; the message says what to fix."""

    def correction(self, n: int) -> str:
        """What the judge is told before it answers again."""
        return (
            f"That reply is not valid: {self}. Reply again with JSON only: "
            f'{{"scores": [{{"trajectory_id": "1", "explanation": "...", "score": 0.5}}, ...]}} '
            f"with exactly {n} entries, ids {id_list(n)}, scores between 0 and 1."
        )


class StructuralFault(MalformedJudgement):
    """Scores that parse, for the wrong set of trajectories: too few or many, or ids missing, repeated or
    unknown (ART 0.5.23's structural checks; its message and its correction's fields)."""

    def __init__(self, received: Sequence[str], n: int) -> None:
        self.received = list(received)
        expected = [str(i) for i in range(1, n + 1)]
        self.missing = [i for i in expected if i not in self.received]
        self.duplicate = sorted({i for i in self.received if self.received.count(i) > 1}, key=_id_order)
        self.unexpected = sorted(set(self.received) - set(expected), key=_id_order)
        if len(self.received) != n:
            super().__init__(f"Expected {n} score{'' if n == 1 else 's'}, but got {len(self.received)}")
        else:
            super().__init__(f"Expected trajectory ids {expected}, but got {self.received}")

    def correction(self, n: int) -> str:
        def listed(ids: list[str]) -> str:
            return ", ".join(ids) or "none"

        count = len(self.received)
        return (
            f"Your response had {count} score object{'' if count == 1 else 's'}; expected {n}. "
            f"Missing trajectory IDs: {listed(self.missing)}. Duplicate trajectory IDs: "
            f"{listed(self.duplicate)}. Unexpected trajectory IDs: {listed(self.unexpected)}. "
            f"Return one complete replacement using each trajectory ID exactly once: {id_list(n)}."
        )


def id_list(n: int) -> str:
    return ", ".join(str(i) for i in range(1, n + 1))


def _id_order(trajectory_id: str) -> tuple[int, str]:
    return (int(trajectory_id), "") if trajectory_id.isdigit() else (1 << 62, trajectory_id)


def _json_candidates(text: str) -> list[Any]:
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL)
    candidates = [*fenced, text]
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    out = []
    for candidate in candidates:
        try:
            out.append(json.loads(candidate.strip()))
        except ValueError:
            continue
    return out


SCALES = (1.0, 10.0, 100.0)
"""The scales a judge's plain numbers are read on: the smallest their largest fits (above 100: 100, clamped)."""


class RawScore(NamedTuple):
    """A score as the judge wrote it: ``value``, and whether it is already a share of 1 (a fraction or a
    percentage) or a plain number on the reply's scale."""

    value: float
    share: bool


def _as_score(value: Any) -> RawScore:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MalformedJudgement(f"a score must be a number, got {value!r}")
    text = str(value).strip()
    try:
        if isinstance(value, str) and "/" in text:  # "8/10"
            numerator, denominator = (float(part) for part in text.split("/", 1))
            raw = RawScore(numerator / denominator, share=True)
        elif isinstance(value, str) and text.endswith("%"):  # "80%"
            raw = RawScore(float(text[:-1]) / 100.0, share=True)
        else:
            raw = RawScore(float(text), share=False)
    except (ValueError, ZeroDivisionError):
        raise MalformedJudgement(f"a score must be a number, got {value!r}") from None
    if not math.isfinite(raw.value):
        raise MalformedJudgement(f"a score must be a finite number, got {value!r}")
    return raw


def normalized(raws: list[RawScore]) -> list[float]:
    """The reply's scores in [0, 1]: shares as they are; plain numbers divided by the smallest of ``SCALES``
    their largest fits, one scale for the reply; then each clamped to [0, 1]."""
    plain = [r.value for r in raws if not r.share]
    largest = max(plain, default=0.0)
    scale = next((s for s in SCALES if largest <= s), SCALES[-1])
    return [min(1.0, max(0.0, r.value if r.share else r.value / scale)) for r in raws]


def _judgements_from(data: Any, n: int) -> list[Judgement]:
    if isinstance(data, dict) and "scores" in data:
        data = data["scores"]
    if isinstance(data, dict):  # {"1": 0.5, "2": 0.9}
        data = [{"trajectory_id": k, "score": v} for k, v in data.items()]
    if not isinstance(data, list):
        raise MalformedJudgement('the reply must be {"scores": [...]}')
    if all(not isinstance(item, dict) for item in data):  # a bare list: scores in trajectory order
        scores = normalized([_as_score(item) for item in data])
        if len(scores) != n:
            raise StructuralFault([str(i) for i in range(1, len(scores) + 1)], n)
        return [Judgement(score) for score in scores]
    received: list[str] = []
    by_id: dict[str, tuple[RawScore, str]] = {}
    for position, item in enumerate(data, start=1):
        if not isinstance(item, dict) or "score" not in item:
            raise MalformedJudgement(f'entry {position} must be an object with a "score"')
        raw_id = item.get("trajectory_id", item.get("id", position))
        match = re.search(r"\d+", str(raw_id))  # "trajectory 2" and 2 both mean "2"
        trajectory_id = str(int(match.group())) if match else str(raw_id).strip()
        received.append(trajectory_id)
        explanation = item.get("explanation")
        by_id[trajectory_id] = (_as_score(item["score"]), "" if explanation is None else str(explanation))
    fault = StructuralFault(received, n)
    if fault.missing or fault.duplicate or fault.unexpected:
        raise fault
    ordered = [by_id[str(i)] for i in range(1, n + 1)]
    scores = normalized([raw for raw, _ in ordered])
    return [Judgement(score, explanation) for score, (_, explanation) in zip(scores, ordered, strict=True)]


def parse_judgements(text: str, n: int) -> list[Judgement]:
    """The ``n`` judgements in a judge's reply, read leniently; ``MalformedJudgement`` says what is wrong."""
    candidates = _json_candidates(text)
    if not candidates:
        raise MalformedJudgement("the reply contains no JSON")
    first_error: MalformedJudgement | None = None
    for data in candidates:
        try:
            return _judgements_from(data, n)
        except MalformedJudgement as err:
            first_error = first_error or err
    assert first_error is not None
    raise first_error
