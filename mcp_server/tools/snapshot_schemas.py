"""Input and output schemas of the snapshot tools (``mcp_server/tools/snapshot.py``; seed 000 §5).

Hybrid tools answer ``oneOf`` [Immutable, Worktree] (``targets.hybrid_output``);
snapshot-only tools answer the immutable shape alone.  Inputs are Draft 2020-12 with
``additionalProperties: false``.  A file of its own beside the tools, which would
otherwise pass 500 lines.
"""

from __future__ import annotations

from typing import Any

from mcp_server.tools import targets as T

_LIMIT = {"type": "integer", "minimum": 1, "maximum": 1_000_000}
_CHANGES = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "status": {"enum": ["added", "deleted", "modified", "type_changed", "untracked", "conflicted"]},
        },
        "required": ["path", "status"],
        "additionalProperties": False,
    },
}
_STATS = {
    "type": "object",
    "properties": {"files": T.COUNT, "bytes": T.COUNT},
    "required": ["files", "bytes"],
    "additionalProperties": False,
}
_SNAPSHOT_OUT = {
    "type": "object",
    "properties": {
        "snapshot_id": T.SNAPSHOT_ID,
        "fingerprint": T.FINGERPRINT,
        "manifest_stats": _STATS,
        "cache_hint": {"const": "immutable"},
    },
    "required": ["snapshot_id", "fingerprint", "manifest_stats", "cache_hint"],
    "additionalProperties": False,
}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "snapshot_create": {
        "description": "Capture files into an immutable content-addressed snapshot: the given paths, else the lease's touched files, else every file git does not ignore.",
        "input": T.input_schema({"lease_id": T.LEASE_ID, "paths": T.PATHS, "capsule_id": T.CAPSULE_ID, "workspace": T.WORKSPACE}),
        "output": _SNAPSHOT_OUT,
    },
    "snapshot_info": {
        "description": "A snapshot's fingerprint and manifest stats (file count, total bytes).",
        "input": T.input_schema({"snapshot_id": T.SNAPSHOT_ID}, ["snapshot_id"]),
        "output": _SNAPSHOT_OUT,
    },
    "snapshot_list": {
        "description": "List a directory of the worktree (issues/uses a lease, touches entries and parents) or of a snapshot (captured entries only).",
        "input": T.input_schema({**T.HYBRID, "path": T.PATH, "recursive": {"type": "boolean", "default": False}, "max_entries": _LIMIT}),
        "output": T.hybrid_output(
            {
                "path": {"type": "string"},
                "entries": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "kind": {"enum": ["file", "dir", "symlink"]}, "size": T.COUNT},
                        "required": ["path", "kind"],
                        "additionalProperties": False,
                    },
                },
                "truncated": {"type": "boolean"},
            },
            ["path", "entries", "truncated"],
        ),
    },
    "snapshot_file": {
        "description": "Read one file from the worktree (touches it) or a snapshot; binary content comes as 'base64:…'.",
        "input": T.input_schema({**T.HYBRID, "path": T.PATH}, ["path"]),
        "output": T.hybrid_output(
            {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "encoding": {"enum": ["utf-8", "base64"]},
                "size": T.COUNT,
                "mode": {"type": "string", "pattern": "^[0-7]{6}$"},
                "blob": T.BLOB_ID,
            },
            ["path", "content", "encoding", "size", "mode", "blob"],
        ),
    },
    "snapshot_grep": {
        "description": "Search text files (binaries excluded, git ignore rules applied) in byte order of path; matches ordered by line and column.",
        "input": T.input_schema(
            {
                **T.HYBRID,
                "pattern": {"type": "string", "minLength": 1},
                "paths": T.PATHS,
                "regex": {"type": "boolean", "default": False},
                "ignore_case": {"type": "boolean", "default": False},
                "max_files": _LIMIT,
                "max_matches": _LIMIT,
            },
            ["pattern"],
        ),
        "output": T.hybrid_output(
            {
                "matches": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "line": T.COUNT, "col": T.COUNT, "text": {"type": "string"}},
                        "required": ["path", "line", "col", "text"],
                        "additionalProperties": False,
                    },
                },
                "files_searched": T.COUNT,
                "truncated": {"type": "boolean"},
                "matches_truncated": {"type": "boolean"},
            },
            ["matches", "files_searched", "truncated", "matches_truncated"],
        ),
    },
    "snapshot_diff": {
        "description": "Unified diff from base_snapshot_id to snapshot_id, or to the live worktree (touches the target paths).",
        "input": T.input_schema({**T.HYBRID, "base_snapshot_id": T.SNAPSHOT_ID, "paths": T.PATHS}, ["base_snapshot_id"]),
        "output": T.hybrid_output({"changes": _CHANGES, "diff": {"type": "string"}}, ["changes", "diff"]),
    },
    "snapshot_changes": {
        "description": "Changed files: the worktree against HEAD (git status, no rename detection), or snapshot_id against base_snapshot_id.",
        "input": T.input_schema({**T.HYBRID, "base_snapshot_id": T.SNAPSHOT_ID}),
        "output": T.hybrid_output({"changes": _CHANGES}, ["changes"]),
    },
    "snapshot_export": {
        "description": "A deterministic tar bundle (sorted entries, fixed metadata) of a snapshot or of live files, as 'base64:…'.",
        "input": T.input_schema({**T.HYBRID, "paths": T.PATHS}),
        "output": T.hybrid_output(
            {
                "format": {"const": "tar"},
                "bundle": {"type": "string", "pattern": "^base64:"},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "size": T.COUNT,
                "files": T.COUNT,
            },
            ["format", "bundle", "sha256", "size", "files"],
        ),
    },
}
