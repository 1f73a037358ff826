"""The one way every client and worker connects to Temporal: the pydantic data converter, settings from env."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from schemas.settings import TemporalSettings


async def connect_client(settings: TemporalSettings | None = None, *, address: str | None = None) -> Client:
    """Connect with the pydantic data converter; ``address`` overrides ``settings``/``DGRPO_TEMPORAL_ADDRESS``."""
    s = settings or TemporalSettings.from_env()
    return await Client.connect(
        address or s.address, namespace=s.namespace, data_converter=pydantic_data_converter
    )
