"""The worktree fingerprint's value (seed 000 §2.2): HEAD, index tree and status hash.

Computing it runs git (``mcp_server.fs.fingerprint``); this is the value and its
canonical form, which leases compare.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mcp_server.core.canonical import canonical_json


@dataclass(frozen=True)
class Fingerprint:
    """HEAD, index tree and status of a worktree."""

    head_oid: str
    index_oid: str
    status_hash: str

    def to_dict(self) -> dict[str, str]:
        """The JSON object of §2.2."""
        return asdict(self)

    def canonical(self) -> bytes:
        """Canonical JSON bytes."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        """Rebuild from the JSON object."""
        return cls(str(data["head_oid"]), str(data["index_oid"]), str(data["status_hash"]))
