"""The numbers the docs state as what the code does: each a phrase of a page, made from the code's own value, so a
changed default (or a page that stops saying it) fails here instead of leaving the page untrue. Measured
figures (faults.md's seconds, benchmarks) are not here: they say what a run showed, with its command."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from urllib3.connection import HTTPConnection

from activities.object_store import _CHUNK, WORKER_OUTAGE_S
from activities.training import REST_WAIT_S
from dgrpo.client.fleet_view import RECENT_STEPS
from schemas.config import FAIRNESS_KEY_BYTES, HEARTBEAT_TIMEOUT_S
from schemas.settings import DEFAULT_STAGE_BOUNDS_S, EngineSettings, WorkerLifecycle
from serving.client import LOAD_TIMEOUT_S
from tests.activities import test_transfer_liveness as SLOW
from workers.heartbeat_ticker import THROTTLE
from workers.keep_trainer import EXIT_TRAINER_STUCK
from workflows.stages import TRAIN

ROOT = Path(__file__).resolve().parent.parent


def number(value: float | timedelta) -> str:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    return f"{seconds:g}"


def one_line(page: str) -> str:
    """The page's text with every run of whitespace one space (claims wrap across lines)."""
    return " ".join((ROOT / page).read_text().split())


ENGINE, LIFECYCLE = EngineSettings(), WorkerLifecycle()
SENT_BLOCK = HTTPConnection(host="localhost").blocksize
"""The block http.client sends a request body in (an upload advances per block: activities/object_store.py)."""
FIRST_RETRY = TRAIN.retry_policy().initial_interval

CLAIMS: list[tuple[str, str]] = [
    ("docs/workers.md", f"every stage's heartbeat timeout is {number(HEARTBEAT_TIMEOUT_S)} s"),
    ("docs/workers.md", f"(beats sent within {number(THROTTLE)} s)"),
    ("docs/workers.md", f"after the first retry interval ({number(FIRST_RETRY)} s)"),
    ("docs/workers.md", f"a `--probe-timeout-s` deadline, {number(ENGINE.probe_timeout_s)} s"),
    ("docs/workers.md", f"`--unanswered-probes` ({ENGINE.unanswered_probes}) probes"),
    ("docs/workers.md", f"loading a new adapter {number(LOAD_TIMEOUT_S)} s"),
    ("docs/workers.md", f"`WORKER_OUTAGE_S` ({number(WORKER_OUTAGE_S)} s, each request"),
    ("docs/workers.md", f"`DGRPO_WORKER_GRACE_S`, default {number(LIFECYCLE.grace_s)})"),
    ("docs/workers.md", f"`DGRPO_TEMPORAL_WAIT_S`, default {number(LIFECYCLE.temporal_wait_s)})"),
    ("docs/workers.md", f"exits with code **{EXIT_TRAINER_STUCK}**"),
    (
        "docs/isolation.md",
        f"`download` (each MiB received) and `upload` (each {SENT_BLOCK >> 10} KiB block sent)",
    ),
    ("docs/isolation.md", f"Temporal's heartbeat timeout ({number(HEARTBEAT_TIMEOUT_S)} s)"),
    (
        "docs/isolation.md",
        f"a {SLOW.ADAPTER_BYTES >> 20} MiB checkpoint through a link of {SLOW.RATE >> 20} MiB/s, both ways, under "
        f"bounds of {number(SLOW.BOUND_S)} s",
    ),
    ("docs/pipelining.md", f"or {number(REST_WAIT_S)} s after the adapter went up (`REST_WAIT_S`)"),
    ("docs/fleet.md", f"from its newest {RECENT_STEPS} steps' wall time"),
    ("docs/fleet.md", f"a key longer than Temporal's {FAIRNESS_KEY_BYTES} bytes is cut"),
]


@pytest.mark.parametrize(("page", "claim"), CLAIMS)
def test_a_page_states_the_codes_value(page: str, claim: str) -> None:
    assert claim in one_line(page), (
        f"{page} no longer says {claim!r}: say the code's value, or change the code"
    )


def test_the_stage_bounds_table_is_the_codes() -> None:
    """docs/isolation.md's table of each stage's bound."""
    rows = re.findall(r"^\| ([a-z_, ]+) \| (\d+) s \|$", (ROOT / "docs/isolation.md").read_text(), re.M)
    table = {stage.strip(): float(seconds) for names, seconds in rows for stage in names.split(",")}
    assert table == DEFAULT_STAGE_BOUNDS_S


def test_a_download_reports_each_mib() -> None:
    assert _CHUNK == 1 << 20  # the isolation page's MiB
