"""A content-addressable store in memory: the reads a REAPI client makes of a CAS
(GetTree, BatchReadBlobs), served from a dict of blobs, for the tests that fetch an input
root (tests/test_reapi_executor.py) or, with the reads and uploads a bot makes
(``LeaseCas``), serve a lease without a cluster (tests/test_reapi_marker.py,
vm-tests/test_attack_bot_replay.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


class MemoryCas:
    """What fetch_input_root asks of a client, served from a built tree's blobs; counts reads."""

    def __init__(self, blobs: dict[tuple[str, int], bytes | Path]) -> None:
        self.blobs = {k: v if isinstance(v, bytes) else v.read_bytes() for k, v in blobs.items()}
        self.read: list[tuple[str, int]] = []

    def get_tree(self, root: Any) -> Iterator[Any]:
        """The Directory messages under ``root``, breadth first (GetTree's order)."""
        from mcp_server.reapi.protos import re_pb2

        pending = [root]
        while pending:
            directory = re_pb2.Directory.FromString(self.blobs[(pending[0].hash, pending[0].size_bytes)])
            pending = pending[1:] + [child.digest for child in directory.directories]
            yield directory

    def read_blobs(self, digests: Any) -> Iterator[tuple[Any, bytes]]:
        """Each digest with its bytes, each read noted in ``read``."""
        for digest in digests:
            self.read.append((digest.hash, digest.size_bytes))
            yield digest, self.blobs[(digest.hash, digest.size_bytes)]


class LeaseCas(MemoryCas):
    """The CAS a bot's lease reads from (its Command, its input root) and uploads to."""

    def read_blob(self, digest: Any) -> bytes:
        return self.blobs[(digest.hash, digest.size_bytes)]

    def upload(self, blobs: dict[Any, bytes]) -> None:
        self.blobs.update(blobs)
