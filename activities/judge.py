"""The judge activity (control queue) and ``ruler_score_group``: RULER-style relative scoring of a group.

The judge sees a whole group in one prompt (the shared context once, the tools the agent had as ART's RULER
shows them, then each distinct trajectory) and answers JSON:
``{"scores": [{"trajectory_id": "1", "explanation": "...", "score": 0.8}, ...]}`` with every score in [0, 1].
Identical trajectories are shown once and share their score; each judged trajectory gets its explanation in
its ``logs`` (``RULER explanation: ...``, as ART's ``ruler_score_group`` logs it).

Small judges write nonsense; the contract with them is:

1. the prompt names how many score objects to return and their ids (``1, 2, ...``), as ART 0.5.23's does;
2. the reply is parsed leniently (code fences, prose around the JSON, a bare list of numbers), and its scores
   are brought to [0, 1] (``normalized``): a score written as a fraction (``"8/10"``) or a percentage
   (``"80%"``) is that share; plain numbers above 1 are read on the scale their largest one fits, 0-10 or
   0-100, every score of the reply on the same one (so their order and ratios are the judge's); what falls
   outside [0, 1] then is clamped;
3. a malformed reply (no JSON, a score that is not a number, or ART's structural faults: the
   wrong number of scores, a missing, duplicate or unexpected trajectory id) is sent back to the judge
   with a correction that says what was wrong; ``STRUCTURAL_ATTEMPTS`` (2, ART's) answers in all;
4. if the last answer is malformed too, the group keeps its rollout rewards and every trajectory gets
   ``metrics["judge_fallback"] = 1`` (0 when judged), so the run never crashes on the judge and the
   fallback rate shows up in the step's metrics. dgrpo's client-side RULER (dgrpo/rewards/ruler.py) raises
   instead, as ART's does.

Where the judge is and which key it gets are the control worker's operator's choice, not the run's: a
run's ``judge.base_url`` must be the worker's own inference server or one of ``JudgeEndpoints.base_urls``
(``dgrpo worker --judge-base-url``), and its ``judge.api_key_env`` a variable paired with that endpoint in
``JudgeEndpoints.keys`` (``--judge-key-env URL=NAME``), so a key never goes to another endpoint; anything
else is a non-retryable ``ConfigError`` sent before any request is made, so a run spec can never send a
worker's secret to a host of its choosing.

Judged scores are cached by the content hash of what the judge was asked (model, rubric, trajectories),
in the object store under ``runs/<run>/judge_cache/<sha256>.json``, so a retried step pays only for the
groups it had not judged yet. Fallbacks are not cached: a retry asks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openai import AsyncOpenAI
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.judge_replies import (
    Judgement,
    MalformedJudgement,
    id_list,
    parse_judgements,
)
from activities.object_store import ObjectStore
from activities.rollout_model import DEFAULT_API_KEY, discover_base_model, own_server_api_key
from activities.run_texts import read_run_text
from activities.trajectory_store import read_ref_groups, upload_groups
from schemas import layout
from schemas.activities import ActivityName, JudgeInput
from schemas.config import JudgeConfig
from schemas.errors import CONFIG_ERROR
from schemas.refs import TrajectoriesRef
from schemas.settings import (
    ENV_INFERENCE_URL,
    ENV_JUDGE_BASE_URLS,
    ENV_JUDGE_KEY_ENVS,
    env_list,
    judge_key_pair,
)
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import openai_base_url

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = (
    "- A trajectory that achieves its goal always scores higher than one that does not.\n"
    "- A trajectory that achieves its goal more efficiently (fewer, clearer steps) scores higher.\n"
    "- If one trajectory is only slightly better than another, their scores should be close.\n"
    "- Scores are between 0 and 1."
)
SYSTEM_PROMPT = (
    "You are an impartial judge. You will see several trajectories of an AI agent working on the same "
    "task. Compare them with each other and score each one from 0 to 1.\n\nGrading rubric:\n{rubric}\n\n"
    'Reply with JSON only, exactly this shape: {{"scores": [{{"trajectory_id": "1", "explanation": '
    '"<one sentence>", "score": <number between 0 and 1>}}, ...]}} with one entry per trajectory.'
)
STRUCTURAL_ATTEMPTS = 2
"""Answers a judge gets for one group: the first and one corrected (ART 0.5.23's ``_STRUCTURAL_ATTEMPTS``)."""
MAX_CHARS_PER_MESSAGE = 2000
GROUP_CONCURRENCY = 4
HEARTBEAT_EVERY_S = 10.0


class JudgeCache(Protocol):
    """Where judgements are kept by content hash."""

    async def get(self, key: str) -> list[Judgement] | None: ...

    async def put(self, key: str, judgements: list[Judgement]) -> None: ...


class StoreJudgeCache:
    """``JudgeCache`` in the object store under ``runs/<run_id>/judge_cache/``."""

    def __init__(self, store: ObjectStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    async def get(self, key: str) -> list[Judgement] | None:
        path = layout.judge_cache_key(self.run_id, key)
        if not await asyncio.to_thread(self.store.exists, path):
            return None
        data = json.loads(await asyncio.to_thread(self.store.get_bytes, path))
        explanations = data.get("explanations") or [""] * len(data["scores"])  # entries cached without them
        return [Judgement(float(s), str(e)) for s, e in zip(data["scores"], explanations, strict=True)]

    async def put(self, key: str, judgements: list[Judgement]) -> None:
        scores, explanations = [j.score for j in judgements], [j.explanation for j in judgements]
        body = json.dumps({"scores": scores, "explanations": explanations}).encode()
        await asyncio.to_thread(self.store.put_bytes, layout.judge_cache_key(self.run_id, key), body)


def _render_content(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
    if message.get("tool_calls"):
        calls = [c.get("function", c) for c in message["tool_calls"]]
        text += ("\n" if text else "") + "tool calls: " + json.dumps(calls, ensure_ascii=False)
    if len(text) > MAX_CHARS_PER_MESSAGE:
        text = text[:MAX_CHARS_PER_MESSAGE] + " [...]"
    return text


def _render(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"[{m.get('role')}] {_render_content(m)}" for m in messages)


def trajectory_key(trajectory: Trajectory) -> str:
    """Content hash of what the judge sees of a trajectory (its messages and tools)."""
    blob = json.dumps([trajectory.messages(), trajectory.tools], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def judge_messages(
    unique: Sequence[Trajectory], rubric: str | None = None, tools: Sequence[Any] | None = None
) -> list[dict[str, str]]:
    """The judge's prompt: shared context once, the ``tools`` the agent could call (so the judge knows which
    tool calls were valid), then each trajectory's own part, numbered from 1."""
    all_messages = [t.messages() for t in unique]
    prefix = 0
    while all(len(m) > prefix + 1 for m in all_messages) and all(
        m[prefix] == all_messages[0][prefix] for m in all_messages
    ):
        prefix += 1
    parts = []
    if prefix:
        parts.append(f"<context>\n{_render(all_messages[0][:prefix])}\n</context>")
    if tools:
        parts.append(f"<available_tools>\n{json.dumps(list(tools), default=str)}\n</available_tools>")
    for i, messages in enumerate(all_messages, start=1):
        parts.append(f'<trajectory id="{i}">\n{_render(messages[prefix:])}\n</trajectory>')
    parts.append(f"Score all {len(unique)} trajectories. Reply with the JSON only.")
    n = len(unique)
    count = (  # ART 0.5.23's prompt names the count and the ids: its most common fault is a short list
        f"\n\nReturn exactly {n} score object{'' if n == 1 else 's'}, one for each of these trajectory IDs, "
        f"with no duplicates or omissions: {id_list(n)}"
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(rubric=rubric or DEFAULT_RUBRIC) + count},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


JudgeCall = Callable[[list[dict[str, str]]], Awaitable[str]]
"""One call to a judge: the conversation so far -> the judge's reply text."""


def client_judge(client: AsyncOpenAI, judge_model: str, max_tokens: int) -> JudgeCall:
    """Calls to ``judge_model`` through ``client``, greedy, each reply at most ``max_tokens``."""

    async def call(conversation: list[dict[str, str]]) -> str:
        response = await client.chat.completions.create(
            model=judge_model,
            messages=conversation,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
        )
        return response.choices[0].message.content or ""

    return call


async def ask_judge_with(
    call: JudgeCall,
    judge_model: str,
    messages: list[dict[str, str]],
    n: int,
    attempts: int = STRUCTURAL_ATTEMPTS,
) -> list[Judgement]:
    """Ask through ``call`` (``client_judge``, or dgrpo's RULER with litellm's ``acompletion`` signature); a
    malformed answer goes back to the judge with a correction, up to ``attempts`` answers in all. Raises the
    last answer's ``MalformedJudgement`` (a ``ValueError`` saying what was wrong) when none was valid."""
    conversation = list(messages)
    for attempt in range(1, attempts + 1):
        reply = await call(conversation)
        try:
            return parse_judgements(reply, n)
        except MalformedJudgement as err:
            log.info("judge %s reply %d malformed (%s): %.200r", judge_model, attempt, err, reply)
            if attempt == attempts:
                raise
            conversation += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": err.correction(n)},
            ]
    raise ValueError(f"attempts must be at least 1, got {attempts}")


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str,
    *,
    client: AsyncOpenAI | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    rubric: str | None = None,
    max_tokens: int = 512,
    cache: JudgeCache | None = None,
    keep_original: bool = True,
    call: JudgeCall | None = None,
    attempts: int = STRUCTURAL_ATTEMPTS,
    fallback: bool = True,
) -> TrajectoryGroup:
    """The group with each trajectory's reward replaced by the judge's relative score in [0, 1].

    Usable as ``after_each`` in ``gather_trajectory_groups``. Give ``client``, ``base_url`` or ``call``. With
    ``keep_original`` the rollout's reward stays in ``metrics["original_reward"]``. A judge whose ``attempts``
    answers are all malformed leaves the rewards as they were, with ``metrics["judge_fallback"] = 1``; without
    ``fallback`` its last ``MalformedJudgement`` is raised instead. The judge is shown the tools the first
    trajectory offered (``tools``, or its captured requests'), as ART's RULER shows them, and each judged
    trajectory logs the explanation the judge gave.
    """
    if len(group.trajectories) < 2:
        return group  # nothing to compare (and GRPO drops such a group anyway)
    own_client: AsyncOpenAI | None = None
    if call is None:
        if client is None:
            if base_url is None:
                raise ValueError(
                    "ruler_score_group needs client=, base_url= (an OpenAI-compatible endpoint) or call="
                )
            client = own_client = AsyncOpenAI(base_url=openai_base_url(base_url), api_key=api_key or "dgrpo")
        call = client_judge(client, judge_model, max_tokens)
    try:
        keys = [trajectory_key(t) for t in group.trajectories]
        unique_keys = list(dict.fromkeys(keys))
        unique = [group.trajectories[keys.index(k)] for k in unique_keys]
        messages = judge_messages(unique, rubric, group.trajectories[0].offered_tools())
        cache_key = hashlib.sha256(json.dumps([judge_model, messages]).encode()).hexdigest()
        judgements = await cache.get(cache_key) if cache is not None else None
        if judgements is None:
            try:
                judgements = await ask_judge_with(call, judge_model, messages, len(unique), attempts)
            except MalformedJudgement as err:
                if not fallback:
                    raise
                log.warning(
                    "judge %s gave no valid judgement in %d answers (%s); the group keeps its rollout rewards",
                    judge_model,
                    attempts,
                    err,
                )
            if judgements is not None and cache is not None:
                await cache.put(cache_key, judgements)
    finally:
        if own_client is not None:
            await own_client.close()
    by_key = dict(zip(unique_keys, judgements or [], strict=False))
    judged = []
    for trajectory, key in zip(group.trajectories, keys, strict=True):
        out = trajectory.model_copy(deep=True)
        out.metrics["judge_fallback"] = judgements is None
        if judgements is not None:
            if keep_original:
                out.metrics["original_reward"] = trajectory.reward
            out.metrics["ruler_score"] = out.reward = by_key[key].score
            if by_key[key].explanation:
                out.log(f"RULER explanation: {by_key[key].explanation}")
        judged.append(out)
    return TrajectoryGroup(judged, exceptions=list(group.exceptions), metadata=dict(group.metadata))


@dataclass(frozen=True)
class JudgeEndpoints:
    """What a control worker's operator lets runs use as a judge, besides the worker's own server."""

    base_urls: tuple[str, ...] = ()
    """Judge endpoints a run's ``judge.base_url`` may name, with no key (compared as ``/v1`` URLs)."""
    keys: tuple[tuple[str, str], ...] = ()
    """(endpoint, variable) pairs: the variable's value is sent to its own endpoint, never to another; a
    paired endpoint may be named by a run too."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeEndpoints:
        """``$DGRPO_JUDGE_BASE_URLS`` (URLs) and ``$DGRPO_JUDGE_KEY_ENVS`` (``URL=NAME`` pairs), comma-separated;
        unset: none."""
        pairs = tuple(judge_key_pair(entry) for entry in env_list(ENV_JUDGE_KEY_ENVS, env))
        return cls(env_list(ENV_JUDGE_BASE_URLS, env), pairs)

    def allows_url(self, url: str) -> bool:
        allowed = [*self.base_urls, *(u for u, _ in self.keys)]
        return openai_base_url(url) in {openai_base_url(u) for u in allowed}

    def pairs(self, url: str, key_env: str) -> bool:
        """True when ``key_env``'s value may be sent to ``url``."""
        return (openai_base_url(url), key_env) in {(openai_base_url(u), k) for u, k in self.keys}


def _refuse(message: str) -> ApplicationError:
    return ApplicationError(message, type=CONFIG_ERROR, non_retryable=True)


class JudgeActivities:
    """The control worker's judge activity, bound to the object store, our inference server and the
    operator's ``JudgeEndpoints``.

    The default judge (``judge.base_url`` unset) is the base model on ``inference_url``, else on
    ``$DGRPO_INFERENCE_URL`` of the control worker's environment; it gets ``$DGRPO_SERVE_API_KEY``.
    ``endpoints`` defaults to ``JudgeEndpoints.from_env()``.
    """

    def __init__(
        self,
        store: ObjectStore,
        inference_url: str | None = None,
        endpoints: JudgeEndpoints | None = None,
    ) -> None:
        self.store = store
        self.inference_url = inference_url or os.environ.get(ENV_INFERENCE_URL) or None
        self.endpoints = endpoints if endpoints is not None else JudgeEndpoints.from_env()

    def all(self) -> list[Callable[..., Any]]:
        return [self.judge]

    async def _judge_model(
        self, config: JudgeConfig, base_url: str, api_key: str, base_model_name: str
    ) -> str:
        if config.model is not None:
            return config.model
        try:
            return await discover_base_model(base_url, api_key=api_key)
        except Exception as err:  # an older server without /v1/models: ask for the spec's name
            log.warning("could not list models at %s (%s); judging with %r", base_url, err, base_model_name)
            return base_model_name

    def endpoint(self, config: JudgeConfig) -> tuple[str, str]:
        """The judge's URL and API key, both checked against the operator's allow-lists before any request."""
        own = self.inference_url
        if config.base_url is None or (
            own is not None and openai_base_url(config.base_url) == openai_base_url(own)
        ):
            if own is None:
                raise _refuse(
                    "judge.base_url is not set and this control worker knows no inference server; set "
                    f"{ENV_INFERENCE_URL} (or --server-url) where the control worker runs, or name a judge "
                    "endpoint the worker's operator allows in judge.base_url"
                )
            base_url, api_key = own, own_server_api_key()
        elif self.endpoints.allows_url(config.base_url):
            base_url, api_key = config.base_url, DEFAULT_API_KEY
        else:
            allowed = ", ".join(self.endpoints.base_urls) or "none"
            raise _refuse(
                f"judge.base_url {config.base_url!r} is not a judge endpoint this control worker allows "
                f"(allowed: {allowed}, and its own inference server); leave judge.base_url unset to judge "
                "with the inference server, or ask the worker's operator to allow it with "
                f"`dgrpo worker control --judge-base-url URL` or {ENV_JUDGE_BASE_URLS}"
            )
        if config.api_key_env is not None:
            if not self.endpoints.pairs(base_url, config.api_key_env):
                paired = ", ".join(f"{u}={k}" for u, k in self.endpoints.keys) or "none"
                raise _refuse(
                    f"judge.api_key_env {config.api_key_env!r} is not a key variable this control worker "
                    f"sends to {openai_base_url(base_url)} (its pairs: {paired}); a key goes only to the "
                    "endpoint it is paired with: remove judge.api_key_env, name its own endpoint in "
                    "judge.base_url, or ask the worker's operator to pair them with "
                    f"`dgrpo worker control --judge-key-env URL=NAME` or {ENV_JUDGE_KEY_ENVS}"
                )
            api_key = os.environ.get(config.api_key_env, "")
            if not api_key:
                raise _refuse(
                    f"judge.api_key_env names {config.api_key_env!r}, but the control worker's environment "
                    "does not set it; export it where the worker runs"
                )
        return base_url, api_key

    @activity.defn(name=ActivityName.JUDGE)
    async def judge(self, input: JudgeInput) -> TrajectoriesRef:
        config = input.judge
        if config.kind == "rollout":
            return input.trajectories
        base_url, api_key = self.endpoint(config)
        rubric = config.rubric
        if input.rubric_ref is not None:  # stored once for the run (activities/run_texts.py)
            rubric = await asyncio.to_thread(
                read_run_text, self.store, input.run_id, "rubric", input.rubric_ref
            )
        groups = await asyncio.to_thread(read_ref_groups, self.store, input.trajectories.ref)
        client = AsyncOpenAI(base_url=openai_base_url(base_url), api_key=api_key)
        judge_model = await self._judge_model(config, base_url, api_key, input.base_model_name)
        cache = StoreJudgeCache(self.store, input.run_id)
        semaphore = asyncio.Semaphore(GROUP_CONCURRENCY)
        done = 0

        async def score(group: TrajectoryGroup) -> TrajectoryGroup:
            nonlocal done
            async with semaphore:
                judged = await ruler_score_group(
                    group,
                    judge_model,
                    client=client,
                    rubric=rubric,
                    max_tokens=config.max_tokens,
                    cache=cache,
                    keep_original=config.kind == "both",
                )
            done += 1
            if activity.in_activity():
                activity.heartbeat({"groups_done": done, "total": len(groups)})
            return judged

        async def keep_alive() -> None:  # one slow judge call must not look like a dead worker
            while True:
                await asyncio.sleep(HEARTBEAT_EVERY_S)
                if activity.in_activity():
                    activity.heartbeat({"groups_done": done, "total": len(groups)})

        beat = asyncio.create_task(keep_alive())
        try:
            scored = await asyncio.gather(*(score(g) for g in groups))
        finally:
            beat.cancel()
            await client.close()
        fallbacks = sum(bool(t.metrics.get("judge_fallback")) for g in scored for t in g.trajectories)
        log.info(
            "judged %d groups of %s step %d with %s; %d fallbacks",
            len(groups),
            input.run_id,
            input.step,
            judge_model,
            fallbacks,
        )
        attempt = activity.info().attempt if activity.in_activity() else 1
        key = layout.scored_key(input.run_id, input.step, attempt)
        return await asyncio.to_thread(upload_groups, self.store, scored, input.run_id, input.step, key=key)
