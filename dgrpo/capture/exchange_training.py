"""A trajectory of captured exchanges (ART 0.5.23's ``art.trajectory`` capture) as dgrpo trains it: the
policy's Chat Completions calls folded, in the order they began, into ``messages_and_choices`` (each request's
messages not yet recorded, then ``choices[0]`` with the token ids the server returned), as ART 0.5.18's
capture records them.

Which calls are the policy's: those naming it as a client sends it, ``model.name`` (``openai_client()``'s
routed name) or a served step of it (``<name>@<n>``, ``<run id>@<n>``); and only where none does, those
naming what ``model.get_inference_name()`` answers now (the base model's served name at step 0, which an
opponent may share). Calls to other models (an opponent, a judge) are left out. The policy called through
another endpoint (``/completions``, ``/responses``, ``/messages``) is refused: dgrpo trains Chat Completions.
The conversion is a copy: the program's trajectory keeps its exchanges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from dgrpo.errors import NoTrainableChoiceError
from schemas.exchanges import PROTOCOLS, TrajectoryExchanges
from schemas.trajectory import Trajectory, TrajectoryGroup


class Policy(Protocol):
    """What a trainable model answers to (``TrainableModel``)."""

    name: str

    @property
    def run_id(self) -> str: ...

    def get_inference_name(self, step: int | None = None) -> str: ...


@dataclass(frozen=True)
class PolicyNames:
    """The model names a program's calls to the policy carry."""

    alias: str
    """``model.name``: what ``openai_client()`` routes to the newest step."""
    served: str
    """``model.get_inference_name()`` now: the newest step's served name, or the base model's at step 0."""
    prefixes: tuple[str, ...]
    """Names that, with ``@<step>``, name a step of the policy."""

    @classmethod
    def of(cls, model: Policy) -> PolicyNames:
        return cls(model.name, model.get_inference_name(), tuple(dict.fromkeys((model.name, model.run_id))))

    def names_the_policy(self, model: str | None) -> bool:
        """True for a name only the policy answers to."""
        if model is None:
            return False
        steps = "|".join(re.escape(p) for p in self.prefixes)
        return model == self.alias or re.fullmatch(rf"(?:{steps})@\d+", model) is not None


def trainable_groups(groups: list[TrajectoryGroup], policy: PolicyNames) -> list[TrajectoryGroup]:
    """The groups with each trajectory of exchanges replaced by its policy's conversation (a copy)."""
    out = []
    for g, group in enumerate(groups):
        if not any(t.exchanges for t in group.trajectories):
            out.append(group)
            continue
        trajectories = [
            _as_messages(t, policy, f"trajectory {i} of group {g}") if t.exchanges else t
            for i, t in enumerate(group.trajectories)
        ]
        out.append(group.model_copy(update={"trajectories": trajectories}))
    return out


def _as_messages(trajectory: Trajectory, policy: PolicyNames, where: str) -> Trajectory:
    models = {e.model for e in trajectory.exchanges.all()}
    chosen = {m for m in models if policy.names_the_policy(m)} or ({policy.served} & models)
    if not chosen:
        raise NoTrainableChoiceError(
            f"{where} captured calls to {sorted(str(m) for m in models)} but none to the policy: call it "
            f"through model.openai_client() with model={policy.alias!r} (or model.get_inference_name())"
        )
    for protocol in PROTOCOLS[1:]:
        if any(e.model in chosen for e in getattr(trajectory.exchanges, protocol)):
            raise NoTrainableChoiceError(
                f"{where} called the policy through the {protocol} endpoint: dgrpo trains the policy's Chat "
                "Completions (client.chat.completions.create) only"
            )
    converted = trajectory.model_copy(
        update={"exchanges": TrajectoryExchanges(), "messages_and_choices": [], "additional_histories": []}
    )
    calls = sorted(
        (e for e in trajectory.exchanges.chat_completions if e.model in chosen), key=lambda e: e.start_time
    )
    for exchange in calls:
        choices = getattr(exchange.response, "choices", None) or []
        if choices:
            converted.add_turn(
                list(exchange.request.get("messages") or []), exchange.request.get("tools"), choices[0]
            )
    return converted
