"""Blob ids: ``sha256:<64 hex>`` of a blob's content (the store is ``mcp_server.fs.blobstore``)."""

from __future__ import annotations

import hashlib

from sandbox.errors import CcwError

PREFIX = "sha256:"


def blob_id_of(data: bytes) -> str:
    """The id a blob with this content has."""
    return PREFIX + hashlib.sha256(data).hexdigest()


def check_blob_id(blob_id: str) -> str:
    """The 64 hex digits of a blob id; INVALID_ARGUMENT for anything else."""
    hexpart = blob_id[len(PREFIX):] if blob_id.startswith(PREFIX) else ""
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise CcwError("INVALID_ARGUMENT", f"{blob_id!r} is not a blob id (sha256:<64 hex>)", {"blob": blob_id})
    return hexpart
