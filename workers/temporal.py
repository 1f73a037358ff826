"""The one way every client and worker connects to Temporal: the pydantic data converter, settings from env."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from schemas.settings import TemporalSettings


async def connect_client(
    settings: TemporalSettings | None = None,
    *,
    address: str | None = None,
    namespace: str | None = None,
    tls: bool = False,
    api_key: str | None = None,
) -> Client:
    """Connect with the pydantic data converter; arguments override ``settings`` (default: the environment,
    ``DGRPO_TEMPORAL_ADDRESS`` / ``DGRPO_TEMPORAL_NAMESPACE``). ``api_key`` is Temporal Cloud's."""
    s = settings or TemporalSettings.from_env()
    return await Client.connect(
        address or s.address,
        namespace=namespace or s.namespace,
        tls=tls,
        api_key=api_key,
        data_converter=pydantic_data_converter,
    )
