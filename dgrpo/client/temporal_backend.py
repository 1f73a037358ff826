"""``TemporalBackend``: an existing Temporal cluster, with ART's ``backend.train`` (dgrpo/client/training.py)."""

from __future__ import annotations

from dgrpo.client.backends import ClusterBackend
from dgrpo.client.s3_backup import ArtS3Backup
from dgrpo.client.training import ArtTraining


class TemporalBackend(ArtTraining, ArtS3Backup, ClusterBackend):
    """An existing Temporal cluster with ``dgrpo worker`` processes running there (e.g. on a GPU box).

    S3 settings come from ``DGRPO_S3_*`` and the server URL from ``inference_url`` or ``DGRPO_INFERENCE_URL``,
    as the client reaches them (a tunnel or load balancer in front of the GPU box's vLLM).
    """

    async def __aenter__(self) -> TemporalBackend:
        await self.start()
        return self
