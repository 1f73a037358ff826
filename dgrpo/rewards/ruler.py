"""``dgrpo.rewards.ruler`` (ART's ``art.rewards.ruler``): ART's RULER API, ``ruler_score_group`` and ``ruler``, on
dgrpo's judge (``activities/judge.py``: the prompt, the lenient parser and its one re-ask).

    groups = await dgrpo.gather_trajectory_groups(
        ..., after_each=lambda g: ruler_score_group(g, "openai/judge", {"api_base": url}, swallow_exceptions=True)
    )

ART reaches the judge through litellm's ``acompletion``; here every judge call goes through this module's
``acompletion``, which takes litellm's arguments and asks any OpenAI-compatible endpoint: ``extra_litellm_params``
gives ``api_base`` (or ``base_url``), ``api_key`` and ``max_tokens``, and without ``api_base`` the inference
server in ``$DGRPO_INFERENCE_URL`` is asked. As in ART, each call's cost goes to the active ``MetricsBuilder``
under ``costs/<context>/judge/ruler`` when it can be priced (a judge without a price, a local model, adds
nothing). A judge that answers malformed JSON twice raises (as ART's parse error does), or drops the group
with ``swallow_exceptions=True``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from activities import judge
from dgrpo.metrics import MetricsBuilder
from schemas.settings import ENV_INFERENCE_URL
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import openai_base_url

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = judge.DEFAULT_RUBRIC
LITELLM_PREFIXES = ("openai/", "hosted_vllm/")
"""litellm's provider prefixes for an OpenAI-compatible server; the endpoint's own model id follows."""
ENDPOINT_PARAMS = ("api_base", "base_url", "api_key", "max_tokens")
COST_SOURCE = "judge/ruler"
"""Where a judge call's cost goes: ``costs/<context>/judge/ruler``, as in ART."""
ModelResponse = ChatCompletion
"""What ``acompletion`` returns (ART's name: litellm's ``ModelResponse``)."""


class TrajectoryScore(BaseModel):
    """The judge's score of one trajectory, as ART's ``ruler`` returns it."""

    trajectory_id: str
    """``"1"``, ``"2"``, ... in the order the message lists were given."""
    explanation: str = ""
    """ART's judge explains each score; dgrpo's parser keeps only the scores, so this stays empty."""
    score: float
    """Between 0 and 1; higher is better, relative to the other trajectories of the group."""


class JudgeFailed(RuntimeError):
    """The judge answered malformed JSON twice."""


def _litellm_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``extra_litellm_params``, refused before any call when it holds one the endpoint does not take."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(ENDPOINT_PARAMS))
    if unknown:
        raise ValueError(
            f"extra_litellm_params {unknown} are not supported: dgrpo's judge takes {list(ENDPOINT_PARAMS)}"
        )
    return params


def _endpoint(judge_model: str, params: Mapping[str, Any]) -> tuple[str, str, str | None, int]:
    """(model id, base URL, API key, max_tokens) of the judge, from ART's litellm-style arguments."""
    base_url = params.get("api_base") or params.get("base_url") or os.environ.get(ENV_INFERENCE_URL)
    if not base_url:
        raise ValueError(
            "no judge endpoint: pass extra_litellm_params={'api_base': 'http://host:port/v1'} (any "
            f"OpenAI-compatible server), or set {ENV_INFERENCE_URL}"
        )
    model = next((judge_model[len(p) :] for p in LITELLM_PREFIXES if judge_model.startswith(p)), judge_model)
    return model, openai_base_url(str(base_url)), params.get("api_key"), int(params.get("max_tokens", 512))


async def acompletion(
    model: str, messages: list[dict[str, str]], *, temperature: float = 0.0, **litellm_params: Any
) -> ModelResponse:
    """One judge call with litellm's ``acompletion`` arguments, on an OpenAI-compatible endpoint (``model``
    without litellm's ``openai/`` or ``hosted_vllm/`` prefix); greedy unless told otherwise."""
    model_id, base_url, api_key, max_tokens = _endpoint(model, _litellm_params(litellm_params))
    async with AsyncOpenAI(base_url=base_url, api_key=api_key or "dgrpo") as client:
        return await client.chat.completions.create(
            model=model_id,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=temperature,
        )


def _record_cost(judge_model: str, response: Any) -> None:
    """The call's cost to the active ``MetricsBuilder``, priced as ``judge_model``'s provider prices it."""
    provider, slash, _ = judge_model.partition("/")
    if not slash or not provider.strip():
        return  # no provider to price it by
    try:
        builder = MetricsBuilder.get_active()
    except LookupError:
        return
    try:
        builder.add_response_cost(COST_SOURCE, response, provider=provider, model_name=judge_model)
    except ValueError:
        log.debug("no price for judge %s: its calls' cost is not recorded", judge_model)


def _judge_call(judge_model: str, params: dict[str, Any]) -> judge.JudgeCall:
    async def call(conversation: list[dict[str, str]]) -> str:
        response = await acompletion(model=judge_model, messages=conversation, **params)
        _record_cost(judge_model, response)
        if not response.choices:
            raise ValueError(f"judge {judge_model!r} returned no choices: {response}")
        return response.choices[0].message.content or ""

    return call


async def ruler(
    message_lists: Sequence[Sequence[dict[str, Any]]],
    judge_model: str = "openai/o3",
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """Score conversations relative to each other (all in one judge prompt); one score per list."""
    if not message_lists:
        return []
    params = _litellm_params(extra_litellm_params)
    trajectories = [Trajectory(messages_and_choices=list(messages)) for messages in message_lists]
    prompt = judge.judge_messages(trajectories, rubric)
    scores = await judge.ask_judge_with(
        _judge_call(judge_model, params), judge_model, prompt, len(trajectories)
    )
    if scores is None:
        raise JudgeFailed(f"judge {judge_model!r} answered malformed JSON twice")
    if debug:
        log.info("RULER scores from %s: %s", judge_model, scores)
    return [TrajectoryScore(trajectory_id=str(i), score=s) for i, s in enumerate(scores, start=1)]


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str = "openai/o3",
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A new group whose rewards are the judge's relative scores, for ``after_each``.

    Each trajectory keeps its rollout reward in ``metrics["independent_reward"]`` and gets
    ``metrics["ruler_score"]``; with ``swallow_exceptions`` a failed judgement returns None (the group
    is dropped) instead of raising.
    """
    if any(t.additional_histories for t in group.trajectories):
        raise ValueError("RULER does not judge additional_histories; score such trajectories yourself")
    try:
        call = _judge_call(judge_model, _litellm_params(extra_litellm_params))
        judged = await judge.ruler_score_group(group, judge_model, rubric=rubric, call=call)
        if any(t.metrics.get("judge_fallback") for t in judged.trajectories):
            raise JudgeFailed(f"judge {judge_model!r} answered malformed JSON twice")
    except Exception:
        if not swallow_exceptions:
            raise
        log.warning("RULER could not score a group; dropping it", exc_info=debug)
        return None
    for trajectory in judged.trajectories:
        if "original_reward" in trajectory.metrics:
            trajectory.metrics["independent_reward"] = trajectory.metrics["original_reward"]
    return TrajectoryGroup(
        judged.trajectories,
        exceptions=list(group.exceptions),
        metadata=dict(group.metadata),
        metrics=dict(group.metrics),
        logs=list(group.logs),
    )


__all__ = ["DEFAULT_RUBRIC", "JudgeFailed", "TrajectoryScore", "acompletion", "ruler", "ruler_score_group"]
