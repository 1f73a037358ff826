"""``dgrpo.rewards.ruler`` (ART's ``art.rewards.ruler``): ART's RULER API, ``ruler_score_group`` and ``ruler``, on
dgrpo's judge (``activities/judge.py``: the prompt, the lenient parser and its one re-ask).

    groups = await dgrpo.gather_trajectory_groups(
        ..., after_each=lambda g: ruler_score_group(g, "openai/judge", {"api_base": url}, swallow_exceptions=True)
    )

ART reaches the judge through litellm's ``acompletion``; here every judge call goes through this module's
``acompletion``, which takes litellm's arguments and reaches the provider the name says as litellm does
(dgrpo/rewards/providers.py): ``openai/o4-mini`` at ``$OPENAI_BASE_URL`` (else OpenAI) with ``$OPENAI_API_KEY``,
``hosted_vllm/...``, ``openrouter/...`` likewise, other providers (``anthropic/...``) through litellm itself;
``extra_litellm_params`` go with the request (``api_base``, ``api_key``, ``temperature``, ...). A name without
a provider prefix asks ``api_base``, else the inference server in ``$DGRPO_INFERENCE_URL``. As in ART, each
call's cost goes to the active ``MetricsBuilder`` under ``costs/<context>/judge/ruler`` when it can be priced.

As in ART 0.5.23, the prompt names how many score objects to return and their ids, and an answer that is
malformed (not JSON, scores out of [0, 1], or structurally wrong: the wrong number of scores, missing,
duplicate or unexpected ids) is sent back to the judge with a correction saying what was wrong, up to
``_STRUCTURAL_ATTEMPTS`` (2) answers; each answer's cost is counted. When none was valid, ``JudgeFailed`` (a
``ValueError``) says what was wrong with the last one (ART's words: ``Expected 2 scores, but got 1``), or
``swallow_exceptions=True`` drops the group. A judge that cannot be reached at all (no endpoint or key, an unknown provider, a
refused key, an endpoint that never answered) raises even then: it would drop every group, and train nothing.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from activities import judge
from dgrpo.errors import UnsupportedArtFeature
from dgrpo.metrics import MetricsBuilder
from dgrpo.rewards.providers import JudgeEndpoint, judge_endpoint, require_litellm
from schemas.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = judge.DEFAULT_RUBRIC
ENDPOINT_PARAMS = ("api_base", "base_url", "api_key")
"""``extra_litellm_params`` that say where the judge is; every other one goes with the request."""
OWN_SERVER_DEFAULTS = {"temperature": 0.0, "max_tokens": 512}
"""What a judge on dgrpo's own server is asked with unless told otherwise (a provider's gets only the call's)."""
COST_SOURCE = "judge/ruler"
"""Where a judge call's cost goes: ``costs/<context>/judge/ruler``, as in ART."""
ModelResponse = ChatCompletion
"""What ``acompletion`` returns (ART's name: litellm's ``ModelResponse``)."""


class TrajectoryScore(BaseModel):
    """The judge's score of one trajectory, as ART's ``ruler`` returns it."""

    trajectory_id: str
    """``"1"``, ``"2"``, ... in the order the message lists were given."""
    explanation: str = ""
    """What the judge said of the trajectory (empty when its answer gave no explanation)."""
    score: float
    """Between 0 and 1; higher is better, relative to the other trajectories of the group."""


class JudgeFailed(ValueError):
    """No answer of the judge was a valid judgement (a ``ValueError``, as ART's structural error is)."""


_STRUCTURAL_ATTEMPTS = judge.STRUCTURAL_ATTEMPTS
"""Answers a judge gets for one group, the corrected ones included (ART 0.5.23's name and value); read at each
call."""


def _failed(judge_model: str, err: judge.MalformedJudgement) -> JudgeFailed:
    answers = _STRUCTURAL_ATTEMPTS
    return JudgeFailed(
        f"{err} (judge {judge_model!r} gave no valid judgement in {answers} answer{'' if answers == 1 else 's'})"
    )


class JudgeUnreachable(RuntimeError):
    """The judge cannot be asked at all: raised even with ``swallow_exceptions``, which would drop every group."""


ANSWERED: set[str] = set()
"""Judge endpoints that answered in this process: a connection error of one of them is a passing failure."""


async def acompletion(model: str, messages: list[dict[str, str]], **litellm_params: Any) -> ModelResponse:
    """One judge call with litellm's ``acompletion`` arguments, reaching ``model``'s provider as litellm does
    (dgrpo/rewards/providers.py); ``litellm_params`` other than the endpoint's go with the request. A judge that
    cannot be asked at all raises ``JudgeUnreachable``: no endpoint or key, a provider without litellm, a refused
    key, an unknown model, or no connection to an endpoint that never answered in this process."""
    try:
        endpoint = judge_endpoint(model, litellm_params)
        if endpoint is None:
            require_litellm(model)
    except (ValueError, UnsupportedArtFeature) as err:
        raise JudgeUnreachable(str(err)) from err
    where = model if endpoint is None else endpoint.base_url
    try:
        if endpoint is None:
            litellm = importlib.import_module("litellm")  # a provider only litellm reaches, asked as ART asks
            response = await litellm.acompletion(
                model=model, messages=messages, caching=False, **litellm_params
            )
        else:
            response = await _ask(endpoint, messages, litellm_params)
    except openai.APIError as err:
        never = isinstance(err, openai.APIConnectionError) and not isinstance(err, openai.APITimeoutError)
        if isinstance(
            err, openai.AuthenticationError | openai.PermissionDeniedError | openai.NotFoundError
        ) or (never and where not in ANSWERED):
            raise JudgeUnreachable(
                f"judge {model!r} at {where} cannot be asked ({type(err).__name__}: {err}); every group would "
                "be dropped. Check its endpoint and key (OPENAI_BASE_URL / OPENAI_API_KEY for openai/..., or "
                "extra_litellm_params={'api_base': ..., 'api_key': ...})"
            ) from err
        raise
    ANSWERED.add(where)
    return response


async def _ask(
    endpoint: JudgeEndpoint, messages: list[dict[str, str]], params: Mapping[str, Any]
) -> ModelResponse:
    """An OpenAI-compatible judge asked with dgrpo's client; fields the client does not name go in the body."""
    request = {k: v for k, v in params.items() if k not in ENDPOINT_PARAMS}
    if endpoint.own_server:
        request = {**OWN_SERVER_DEFAULTS, **request}
    async with AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "dgrpo") as client:
        create = client.chat.completions.create
        named = set(inspect.signature(create).parameters)
        extra_body = {k: v for k, v in request.items() if k not in named}  # a provider's own fields
        request = {k: v for k, v in request.items() if k in named}
        if extra_body:
            request["extra_body"] = {**extra_body, **(request.get("extra_body") or {})}
        return await create(model=endpoint.model, messages=messages, **request)  # type: ignore[arg-type]


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
    tools: Sequence[Any] | None = None,
    *,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """Score conversations relative to each other (all in one judge prompt); one score and the judge's
    explanation per list. ``tools``: the tool definitions the agent had, shown to the judge so it knows which
    tool calls were valid (ART 0.5.23's argument)."""
    if not message_lists:
        return []
    params = dict(extra_litellm_params or {})
    trajectories = [Trajectory(messages_and_choices=list(messages)) for messages in message_lists]
    prompt = judge.judge_messages(trajectories, rubric, tools)
    try:
        judgements = await judge.ask_judge_with(
            _judge_call(judge_model, params), judge_model, prompt, len(trajectories), _STRUCTURAL_ATTEMPTS
        )
    except judge.MalformedJudgement as err:
        raise _failed(judge_model, err) from err
    scores = [
        TrajectoryScore(trajectory_id=str(i), score=j.score, explanation=j.explanation)
        for i, j in enumerate(judgements, start=1)
    ]
    if debug:
        for score in scores:
            log.info("RULER %s: trajectory %s scored %.3f: %s", judge_model, score.trajectory_id, score.score,
                     score.explanation)  # fmt: skip
    return scores


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

    Each trajectory keeps its rollout reward in ``metrics["independent_reward"]``, gets
    ``metrics["ruler_score"]`` and logs the explanation the judge gave (``RULER explanation: ...``); the judge
    sees the tools the first trajectory offered, as in ART; ``debug`` logs each score with its explanation.
    With ``swallow_exceptions`` a failed judgement returns None (the group is dropped) instead of raising.
    """
    if any(t.additional_histories for t in group.trajectories):
        raise ValueError("RULER does not judge additional_histories; score such trajectories yourself")
    try:
        call = _judge_call(judge_model, dict(extra_litellm_params or {}))
        try:
            judged = await judge.ruler_score_group(
                group, judge_model, rubric=rubric, call=call, attempts=_STRUCTURAL_ATTEMPTS, fallback=False
            )
        except judge.MalformedJudgement as err:
            raise _failed(judge_model, err) from err
    except JudgeUnreachable:
        raise  # even when swallowing: it would drop every group
    except Exception as err:
        if not swallow_exceptions:
            raise
        log.warning(
            "RULER could not score a group; dropping it: %s: %s", type(err).__name__, err, exc_info=debug
        )
        return None
    for trajectory in judged.trajectories:
        if "original_reward" in trajectory.metrics:
            trajectory.metrics["independent_reward"] = trajectory.metrics["original_reward"]
        if debug:
            log.info("RULER %s: scored %.3f; %s", judge_model, trajectory.reward, "; ".join(trajectory.logs))
    return TrajectoryGroup(
        judged.trajectories,
        exceptions=list(group.exceptions),
        metadata=dict(group.metadata),
        metrics=dict(group.metrics),
        logs=list(group.logs),
    )


__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeFailed",
    "JudgeUnreachable",
    "TrajectoryScore",
    "acompletion",
    "ruler",
    "ruler_score_group",
]
