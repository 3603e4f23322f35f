"""Comparing a replay with its witness: what decides ``replay_ok``, what is only shown.

ARCHITECTURE.md, "Decisions": ``replay_ok`` means what a reviewer means by "it does the same thing":

- every exec ends the same way: exit code, signal, timed out or not;
- every exec writes the same files: its ``touched.written`` set, restricted to the paths
  its run ended up changing, and compared when both runs recorded it the same way
  (traced with fanotify on both sides, or on neither: a rootless replay of a traced
  witness sees only what the upper dir shows).  Paths that do not survive are left
  out: a temp file renamed into place (pytest writes ``x.pyc.<pid>`` then renames it)
  is named by whichever of its names the file had when the tracer read the event, so
  it would make the comparison depend on a race.  Paths a volatile glob matches
  (core/volatile.py: nyc's ``.nyc_output/<uuid>.json``) are left out and reported apart;
  a mismatch whose names differ only by a random-looking part suggests the glob;
- the capsule ends with the same changes: for every path either run changed, the same
  type, mode, link target and content (blake3).  A file written with different bytes
  ("files written (content hashes)") shows up here, by name.  Volatile paths aside.

- every exec reaches the same places: the distinct (host, port, protocol, allowed) of
  its connection attempts (``touched.network``), when the capsule has an allowlist.  Bytes,
  addresses and the order of attempts are left out: a download's size, a resolver's
  answer and which connection opened first are the world's, not the run's.

Output is compared apart from that.  ``output_identical`` says whether every stream of
every exec has the same bytes (its blake3, as captured); where it differs,
``output_diffs`` shows the lines that differ, per exec and stream, as unified-diff lines
with no context (``-`` the witness, ``+`` the replay), at most ``MAX_DIFF_LINES`` each,
so an agent sees at a glance that only ``in 0.55s`` changed.  A test runner that prints
durations therefore replays ``replay_ok: true, output_identical: false``; a policy may
still ask for identical output (``require_identical_output``).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from mcp_server.core import volatile

EXEC_FIELDS = ("exit_code", "signal", "timed_out")
MAX_DIFF_LINES = 40  # per exec and stream


def _path_key(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def exec_mismatches(expected: dict[str, Any], actual: dict[str, Any]) -> list[dict[str, Any]]:
    """How a replayed exec ended differently from the recorded one."""
    out = []
    for name in EXEC_FIELDS:
        if actual.get(name) != expected.get(name):
            out.append({"kind": "exec", "exec": expected["seq"], "field": name,
                        "expected": expected.get(name), "actual": actual.get(name), "argv": expected["argv"]})
    return out


def _written(
    expected: dict[str, Any], actual_touched: dict[str, Any], expected_changed: set[str], actual_changed: set[str],
) -> tuple[set[str], set[str]] | None:
    want = expected["touched"]
    if (want.get("read") is None) != (actual_touched.get("read") is None):
        return None
    return set(want["written"]) & expected_changed, set(actual_touched["written"]) & actual_changed


def written_mismatch(
    expected: dict[str, Any], actual_touched: dict[str, Any], expected_changed: set[str], actual_changed: set[str],
    volatile_globs: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Whether a replayed exec wrote other surviving files than the recorded one (None: the same).

    Paths a volatile glob matches are left out.  Where the names left differ only by a
    random-looking part, ``suggest`` lists the globs that would cover them.
    """
    sets = _written(expected, actual_touched, expected_changed, actual_changed)
    if sets is None:
        return None
    wrote, _ = volatile.split(sets[0], volatile_globs)
    wrote_now, _ = volatile.split(sets[1], volatile_globs)
    if wrote == wrote_now:
        return None
    expected_only = sorted(wrote - wrote_now, key=_path_key)
    actual_only = sorted(wrote_now - wrote, key=_path_key)
    return {"kind": "exec", "exec": expected["seq"], "field": "written", "argv": expected["argv"],
            "expected_only": expected_only, "actual_only": actual_only,
            "suggest_volatile": volatile.suggest(expected_only, actual_only)}


def volatile_written(
    expected: dict[str, Any], actual_touched: dict[str, Any], expected_changed: set[str], actual_changed: set[str],
    volatile_globs: Sequence[str],
) -> list[dict[str, Any]]:
    """The volatile paths one exec wrote, each with whether the recorded and the replayed run wrote it."""
    sets = _written(expected, actual_touched, expected_changed, actual_changed)
    if sets is None or not volatile_globs:
        return []
    _, recorded = volatile.split(sets[0], volatile_globs)
    _, replayed = volatile.split(sets[1], volatile_globs)
    return [{"exec": expected["seq"], "path": path, "recorded": path in recorded, "replayed": path in replayed}
            for path in sorted(recorded | replayed, key=_path_key)]


def _reached(records: list[dict[str, Any]] | None) -> list[tuple[str, int, str, bool]]:
    return sorted({(r["host"], r["port"], r["protocol"], bool(r["allowed"])) for r in records or ()})


def network_mismatch(expected: dict[str, Any], actual_network: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Whether a replayed exec reached other places than the recorded one (None: the same).

    A record without ``touched.network`` (made before allowlists, or network none) and a
    replay without one agree.
    """
    want, got = _reached(expected["touched"].get("network")), _reached(actual_network)
    if want == got:
        return None
    return {"kind": "exec", "exec": expected["seq"], "field": "network", "argv": expected["argv"],
            "expected_only": [list(t) for t in sorted(set(want) - set(got))],
            "actual_only": [list(t) for t in sorted(set(got) - set(want))]}


def _final_states(changes: list[dict[str, Any]]) -> dict[str, tuple[Any, ...] | None]:
    # Only where each path ends up matters: "modified" against the original base and
    # "added" against a rebuilt base that holds just the files used are the same outcome.
    return {
        c["path"]: None if c["status"] == "deleted" else (c["type"], c["mode"], c["target"], c["blob"])
        for c in changes
    }


def change_mismatches(
    expected: list[dict[str, Any]], actual: list[dict[str, Any]], volatile_globs: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Every path whose final state differs between the witness's changes and the replay's (volatile ones aside)."""
    want = _final_states(expected)
    got = _final_states(actual)
    out = []
    kept, _ = volatile.split(set(want) | set(got), volatile_globs)
    for path in sorted(kept, key=_path_key):
        if want.get(path) != got.get(path):
            out.append({"kind": "change", "path": path, "expected": want.get(path), "actual": got.get(path)})
    return out


def output_diff(
    expected: dict[str, Any], stream: str, actual_hash: str, actual: bytes, kept: tuple[bytes, int] | None,
) -> dict[str, Any] | None:
    """None when a stream's output is identical; else the lines that differ.

    ``kept`` is the recorded output as the witness carries it (bytes, cap in force), or
    None for a witness made before outputs were kept: then only the hashes are known.
    """
    if actual_hash == expected[f"{stream}_blake3"]:
        return None
    diff: dict[str, Any] = {"exec": expected["seq"], "stream": stream, "argv": expected["argv"],
                            "expected_bytes": expected[f"{stream}_bytes"], "actual_bytes": len(actual)}
    if kept is None:
        diff.update(lines=None, lines_omitted=0,
                    note="this witness does not carry its output (made by an older ccw): only the hashes differ")
        return diff
    data, cap = kept
    compared = actual[:cap]
    lines = [
        line for line in difflib.unified_diff(
            data.decode("utf-8", "replace").splitlines(), compared.decode("utf-8", "replace").splitlines(),
            n=0, lineterm="",
        )
        if not line.startswith(("---", "+++"))
    ]
    diff["lines"] = lines[:MAX_DIFF_LINES]
    diff["lines_omitted"] = max(0, len(lines) - MAX_DIFF_LINES)
    if expected[f"{stream}_bytes"] > len(data) or len(actual) > cap:
        diff["note"] = f"only the first {cap} bytes of each side are compared line by line (the cap kept per stream)"
    elif not lines:
        diff["note"] = "the bytes differ but no line does (line endings or a missing final newline)"
    return diff
