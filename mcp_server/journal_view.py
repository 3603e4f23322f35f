"""Journaled execs as people read them: a run's line in ``ccw capsule log`` and in the
dashboard's list (``exec_summary``), and a run whole, as ``ccw capsule show`` prints it
(``exec_detail``).

These take what the journal returned (``Journal.execs``, ``Journal.outputs``) and read
nothing themselves, so the command and the dashboard show the same fields.
"""

from __future__ import annotations

from typing import Any


def exec_summary(entry: dict[str, Any]) -> dict[str, Any]:
    """One journaled exec as ``log`` lists it."""
    touched = entry.get("touched") or {}
    read = touched.get("read")
    cut_short = (entry.get("usage") or {}).get("cut_short")  # its reply never came (capsules/exec.py cut_entry)
    return {
        "run": entry["seq"], "started_at": entry["started_at"], "argv": entry["argv"], "cwd": entry["cwd"],
        "exit_code": entry["exit_code"], "signal": entry["signal"], "timed_out": entry["timed_out"],
        "oom_killed": entry["oom_killed"], "duration_ms": entry["duration_ms"],
        "generation": entry.get("generation"), "generation_out": entry.get("generation_out"),
        "reads": None if read is None else len(read),
        "writes": None if cut_short else len(touched.get("written") or []), "cut_short": cut_short,
        "connections": len(touched.get("network") or []), "terminal": bool(entry.get("terminal")),
        "service": entry.get("service")}  # a service's exec: its name (capsules/services.py)


def exec_detail(entry: dict[str, Any], outputs: dict[str, tuple[bytes, int] | None]) -> dict[str, Any]:
    """One journaled exec whole, as ``show`` prints it: the summary, usage, output, touched sets."""
    touched = entry.get("touched") or {}
    kept = {}
    for stream, found in outputs.items():
        data = found[0] if found is not None else None
        kept[stream] = None if data is None else data.decode("utf-8", "replace")
        kept[f"{stream}_bytes"] = entry[f"{stream}_bytes"]
    return {
        **exec_summary(entry), "usage": {k: v for k, v in (entry.get("usage") or {}).items()
                                        if k not in ("sources", "unavailable", "cut_short")},
        "output": kept, "written": list(touched.get("written") or []), "read": touched.get("read"),
        "network": list(touched.get("network") or []),
    }
