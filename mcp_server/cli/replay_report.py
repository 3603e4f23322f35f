"""How ``ccw capsule witness`` and ``ccw capsule replay`` print their results for a person.

A replay's mismatches (core/replaydiff.py) become one sentence each; what a person can
do about them (the ``--volatile`` flags a suggestion names, owners a non-root replayer
could not restore) goes to stderr, so stdout stays the verdict and its reasons.  A
witness and its replay are a capsule's doing (names, argv, output): every line is
written with its control characters visible.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from mcp_server.cli.output import paint, visible


def show_witness(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    # The id alone on stdout, as create prints a capsule's: W=$(ccw capsule witness CAP) is
    # then what ccw capsule replay "$W" takes.  The file, to copy to another machine, on stderr.
    print(visible(result["witness_id"]))
    print(visible(f"{result['path']} (root_hash {result['root_hash']}, {result['size_bytes']} bytes)"),
          file=sys.stderr)
    return 0


def show_replay(result: dict[str, Any], color_out: bool, color_err: bool) -> int:
    ok = result["replay_ok"]
    print("replay_ok" if ok else "replay MISMATCH")
    print(visible(signature_line(result)), file=sys.stderr)
    if result.get("signature", "valid") != "valid":
        print(paint("ccw: no trusted signature (the line above); replayed as --allow-untrusted asked", "\x1b[33m",
                    color_err), file=sys.stderr)
    if result.get("env_missing"):
        print(visible(f"not given (--env NAME=VALUE): {' '.join(result['env_missing'])}"), file=sys.stderr)
    # a toolchain the witness's capsule showed and this replay does not: its commands fail for it (exit 127)
    for dropped in (result.get("expose") or {}).get("dropped") or ():
        print(visible(f"not shown here: {dropped['path']} ({dropped['reason']})"), file=sys.stderr)
    for mismatch in result.get("mismatches", []):
        print(f"  {visible(mismatch_line(mismatch))}")
    suggested = sorted({glob for m in result.get("mismatches", []) for glob in m.get("suggest_volatile") or ()})
    if suggested:
        print("the names differ by a random part, or the bytes on every run; "
              "if these outputs are volatile, replay with "
              + visible(" ".join(f"--volatile {shlex.quote(glob)}" for glob in suggested)), file=sys.stderr)
    owners = result.get("owners") or {}
    if owners.get("reason") and owners.get("restored", 0) < owners.get("recorded", 0):
        print(f"owners: {owners['restored']} of {owners['recorded']} restored ({owners['reason']})", file=sys.stderr)
    apart = (result.get("volatile") or {}).get("paths") or []
    if apart:
        print(visible(f"left out as volatile: {len(apart)} path(s) matching {', '.join(result['volatile']['globs'])}"),
              file=sys.stderr)
    ignored = result.get("ignored_differences") or []
    if ignored:  # files promotion leaves behind: shown, never a failure unless --strict-outputs
        print(visible(f"differ in files the witness's git ignores (not compared; --strict-outputs compares them): "
                      f"{len(ignored)}"), file=sys.stderr)
        for mismatch in ignored:
            print(f"  {visible(mismatch_line(mismatch))}", file=sys.stderr)
    for diff in result.get("output_diffs", []):  # shown, never a failure by itself
        print(f"output differs: exec {diff['exec']} {diff['stream']}", file=sys.stderr)
        for line in diff["lines"] or [diff.get("note", "")]:
            print(f"  {visible(line)}", file=sys.stderr)
    return 0 if ok else 1


def signature_line(result: dict[str, Any]) -> str:
    """``signature: valid (NAME)``, ``signature: unknown key (SHA256:...)``, ``signature: unsigned``..."""
    signer = result.get("signed_by") or {}
    who = signer.get("name") or signer.get("fingerprint")
    return f"signature: {result.get('signature', 'valid')}" + (f" ({who})" if who else "")


def _state(state: list[Any] | None) -> str:
    """A change's final state as a replay reports it ([type, mode, target, blob] or null)."""
    if state is None:
        return "absent"
    kind, mode, target, blob = state
    return " ".join(str(part) for part in (kind, oct(mode) if isinstance(mode, int) else None,
                                           f"-> {target}" if target else None, (blob or "")[:19] or None) if part)


def mismatch_line(m: dict[str, Any]) -> str:
    """One replay mismatch (core/replaydiff.py) as a line a person reads."""
    if m.get("kind") == "change":
        return f"{m['path']}: {_state(m.get('expected'))} in the witness, {_state(m.get('actual'))} in the replay"
    head = f"exec {m.get('exec')} ({shlex.join(m.get('argv') or [])})"
    if "expected_only" in m:
        def few(items: list[Any]) -> str:
            shown = [":".join(map(str, i)) if isinstance(i, list) else str(i) for i in items[:3]]
            return ", ".join(shown) + (f" and {len(items) - 3} more" if len(items) > 3 else "") if items else "none"
        return (f"{head} {m['field']}: only in the witness {few(m['expected_only'])}; "
                f"only in the replay {few(m['actual_only'])}")
    return f"{head} {m.get('field')}: {m.get('expected')!r} in the witness, {m.get('actual')!r} in the replay"
