"""Witness tools: capsule_witness, witness_verify, witness_list (seed 003 §4; replay is in replay.py).

Adapters over mcp_server/capsules/witness.py, which says what a witness holds and how
it is stored.  ``capsule_witness`` runs in the capsule's turn (after the execs sent
before it, so it holds their runs whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from mcp_server.capsules.fragments import CAPSULE_ID, PROBLEMS, WITNESS_ID
from mcp_server.capsules.turns import TakesTurn
from mcp_server.capsules.witness import (
    WitnessOptions,
    locate,
    make_witness,
    stored_witnesses,
    verify_file,
    witness_key,
)
from mcp_server.capsules.witness_base import DEFAULT_MAX_BASE_MB
from mcp_server.events import finished, record_outcome
from mcp_server.fs.witness_key import SIGNATURE_SCHEMA as SIGNATURE
from mcp_server.fs.witness_key import SIGNED_BY_SCHEMA as SIGNED_BY
from mcp_server.tools.registry import ToolContext, ToolSpec


async def capsule_witness(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Package the capsule's execs and changes as a witness archive, in the capsule's turn."""
    options = WitnessOptions(args.get("compress") or "zstd", bool(args.get("include_blobs", True)),
                             args.get("max_base_mb") or DEFAULT_MAX_BASE_MB, args.get("carry") == "all")
    service = ctx.capsules
    service.live_record(args["capsule_id"])
    async with service.turn(args["capsule_id"], WITNESS):
        result = await make_witness(service, args["capsule_id"], options)
    record_outcome(ctx.state, args["capsule_id"], witness_events(result, None))
    return result


def witness_events(result: Mapping[str, Any] | None, error: BaseException | None) -> list[tuple[str, dict[str, Any]]]:
    """A witness made (``ToolSpec.outcome``): where it is, its hash and size; a failure is no event."""
    made = finished(result)
    if made is None:
        return []
    return [("witness", {key: made.get(key) for key in ("witness_id", "path", "root_hash", "size_bytes")})]


async def witness_verify(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Recompute every hash of a witness, list what does not match, and say whose signature it bears."""
    path, expected = locate(ctx.state, args.get("witness_id"), args.get("path"))
    key = await trio.to_thread.run_sync(witness_key, ctx.state)
    report = await trio.to_thread.run_sync(verify_file, path, args.get("root_hash") or expected, key)
    return {"ok": report["ok"], "root_hash": report["root_hash"], "problems": report["problems"],
            **report["verdict"].report()}


async def witness_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Witnesses made here, newest first."""
    return {"witnesses": stored_witnesses(ctx.state, args.get("capsule_id"))}


WITNESS = TakesTurn("witness")  # the turn it takes (capsules/turns.py)

TOOLS = [
    ToolSpec(
        name="capsule_witness",
        family="witness",
        title="Make witness",
        description=(
            "Package the capsule's runs (argv, exit codes, output hashes, usage, files touched) and "
            "its changes as a replayable .tar.zst witness; root_hash (blake3) covers every byte, and this state "
            "dir signs it (capsule_replay here trusts only what it signed)."
        ),
        input_schema={
            "type": "object", "required": ["capsule_id"], "additionalProperties": False,
            "properties": {
                "capsule_id": CAPSULE_ID,
                "compress": {"enum": ["zstd", "none"]},
                "include_blobs": {"type": "boolean",
                                  "description": "Carry the base files the runs used (default true)."},
                "carry": {"enum": ["used", "all"], "description": (
                    "Base files that travel: those the runs used (default: opened, listed, run, linked), or all "
                    "(.git aside) for runs that decide from stat alone, such as make with up-to-date targets.")},
                "max_base_mb": {"type": "integer", "minimum": 1, "maximum": 1 << 20, "description": (
                    f"Most MiB of base files the witness may carry (default {DEFAULT_MAX_BASE_MB}); "
                    "past it, TOO_LARGE.")},
            },
        },
        output_schema={
            "type": "object", "required": ["witness_id", "path", "root_hash", "size_bytes"],
            "additionalProperties": False,
            "properties": {
                "witness_id": WITNESS_ID, "path": {"type": "string"},
                "root_hash": {"type": "string", "pattern": "^blake3:[0-9a-f]{64}$"}, "size_bytes": {"type": "integer"},
                "base": {
                    "type": "object", "additionalProperties": False,
                    "required": ["carried", "read_sets_complete", "files", "dirs", "symlinks"],
                    "description": "The base entries a replay rebuilds from: 'used' (what the runs opened, listed, "
                                   "ran or followed) or 'all' (asked for, or the read sets are unknown: rootless).",
                    "properties": {
                        "carried": {"enum": ["used", "all"]}, "read_sets_complete": {"type": "boolean"},
                        "files": {"type": "integer"}, "dirs": {"type": "integer"}, "symlinks": {"type": "integer"},
                        "unknown_reads": {"type": "string", "description": "Why the read sets are unknown, when a "
                                          "service still running could not say what it read."},
                    },
                },
            },
        },
        handler=capsule_witness,
        outcome=witness_events,
        turn=WITNESS,
        scope="exec",
        aliases=("capsule/witness",),
        idempotent=True,
    ),
    ToolSpec(
        name="witness_verify",
        family="witness",
        title="Verify witness",
        description=(
            "Recompute every hash of a witness (by id or path); problems name each bad blob or field. signature: "
            "'valid' (by this state dir's key or a trusted one: signed_by names it), 'unknown key' (by a key not "
            "trusted here: `ccw witness trust`), 'invalid' (changed after signing), or 'unsigned'; capsule_replay "
            "refuses all but 'valid' unless allow_untrusted."
        ),
        input_schema={
            "type": "object", "additionalProperties": False,
            "properties": {"witness_id": WITNESS_ID, "path": {"type": "string"}, "root_hash": {"type": "string"}},
        },
        output_schema={
            "type": "object", "required": ["ok", "root_hash", "problems", "signature"], "additionalProperties": False,
            "properties": {"ok": {"type": "boolean"}, "root_hash": {"type": "string"}, "problems": PROBLEMS,
                           "signature": SIGNATURE, "signed_by": SIGNED_BY},
        },
        handler=witness_verify,
        scope="read",
        aliases=("witness/verify",),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="witness_list",
        family="witness",
        title="List witnesses",
        description="Witnesses made by this server, newest first (optionally of one capsule).",
        input_schema={"type": "object", "additionalProperties": False, "properties": {"capsule_id": CAPSULE_ID}},
        output_schema={
            "type": "object", "required": ["witnesses"], "additionalProperties": False,
            "properties": {"witnesses": {"type": "array", "items": {"type": "object"}}},
        },
        handler=witness_list,
        scope="read",
        aliases=("witness/list",),
        read_only=True,
        idempotent=True,
    ),
]
