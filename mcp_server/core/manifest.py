"""Snapshot manifests and ids (seed 000 §2.4).

A manifest is ``{"entries": [{"path", "blob"}, …]}`` in canonical JSON with entries in
byte order of path; ``snapshot_id = "sha256:" + sha256(canonical_fingerprint_json + "\\n"
+ manifest_bytes)``.  The manifest names content only: file modes and kinds are kept
beside it (the snapshot tables) and do not change the id, just as seed 000 defines it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp_server.core.canonical import canonical_json
from mcp_server.core.paths import ROOT, path_key, sort_paths


def manifest_entries(files: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """``[{"path", "blob"}]`` sorted by path bytes; duplicate paths are an error."""
    pairs = list(files.items()) if isinstance(files, Mapping) else list(files)
    pairs.sort(key=lambda item: path_key(item[0]))
    for before, after in itertools.pairwise(pairs):
        if before[0] == after[0]:
            raise ValueError(f"manifest names {before[0]!r} twice")
    return [{"path": path, "blob": blob} for path, blob in pairs]


def manifest_bytes(files: Mapping[str, str] | Iterable[tuple[str, str]]) -> bytes:
    """The canonical manifest bytes."""
    return canonical_json({"entries": manifest_entries(files)})


def snapshot_id(fingerprint: Mapping[str, Any], manifest: bytes) -> str:
    """``sha256:<hex>`` of the canonical fingerprint, a newline and the manifest bytes."""
    digest = hashlib.sha256(canonical_json(dict(fingerprint)) + b"\n" + manifest)
    return "sha256:" + digest.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One captured file: content blob, size in bytes, git-style mode."""

    path: str
    blob: str
    size: int
    mode: int = 0o100644


@dataclass(frozen=True)
class Snapshot:
    """A stored snapshot: id, the fingerprint it was taken at, entries in path order."""

    snapshot_id: str
    fingerprint: dict[str, str]
    entries: tuple[Entry, ...]
    created: float

    def by_path(self) -> dict[str, Entry]:
        """Entries keyed by path."""
        return {e.path: e for e in self.entries}

    @property
    def total_bytes(self) -> int:
        """Sum of the entries' sizes."""
        return sum(e.size for e in self.entries)


def compare_entries(old: dict[str, Entry], new: dict[str, Entry]) -> list[dict[str, str]]:
    """How ``new`` differs from ``old``, path by path in byte order: added, deleted, modified, type_changed."""
    out = []
    for path in sort_paths([*old, *new]):
        a, b = old.get(path), new.get(path)
        if a is None:
            out.append({"path": path, "status": "added"})
        elif b is None:
            out.append({"path": path, "status": "deleted"})
        elif a.blob != b.blob or a.mode != b.mode:
            kind = "type_changed" if (a.mode ^ b.mode) & 0o170000 else "modified"
            out.append({"path": path, "status": kind})
    return out


def tree_entries(files: list[tuple[str, int, int]], base: str, recursive: bool) -> list[dict[str, Any]]:
    """List entries under ``base`` from a flat file list; directories are implicit."""
    out: dict[str, dict[str, Any]] = {}
    prefix = "" if base == ROOT else base + "/"
    for path, size, mode in files:
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix):]
        parts = rest.split("/")
        if recursive:
            for depth in range(1, len(parts)):
                d = prefix + "/".join(parts[:depth])
                out.setdefault(d, {"path": d, "kind": "dir"})
            out[path] = {"path": path, "kind": "symlink" if mode == 0o120000 else "file", "size": size}
        elif len(parts) == 1:
            out[path] = {"path": path, "kind": "symlink" if mode == 0o120000 else "file", "size": size}
        else:
            d = prefix + parts[0]
            out.setdefault(d, {"path": d, "kind": "dir"})
    return [out[k] for k in sort_paths(out)]
