"""One name per idea (issue 40): the banned forms that docs/names.md's table lists stay out of
the source and the docs, and each JSON-RPC error code is defined once.

The glossary is the test's source: each row of its "Banned forms" table is a regular
expression, what to say instead and where the ban holds.  What matches anyway must be in
one of two lists below: ``KEPT``, a form that is stored or on the wire (and so keeps its
name), or ``PENDING``, an occurrence in a file that others were editing when the rename was
made, left for them to finish.  An entry that no longer matches fails too, so both lists
shrink as the code does.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "names.md"
SOURCE_SUFFIXES = (".py", ".c", ".h", ".js", ".html")
ROW_RE = re.compile(r"^\| `(?P<banned>.+?)` \| (?P<say>.+?) \| (?P<scope>.+?) \|$")

# Stored or on the wire, so kept: (file, banned form) -> why.  None today: the event kinds,
# `run_id`, `argv` and `touched.network` that keep their names match no banned form.
KEPT: dict[tuple[str, str], str] = {}

# In files others were editing (issue 40's "one name per idea" left them): (file, banned form).
PENDING: set[tuple[str, str]] = set()


def banned_forms() -> list[tuple[re.Pattern[str], str, str]]:
    """The glossary's table: (form, what to say instead, scope), in its order."""
    text = GLOSSARY.read_text()
    section = text[text.index("## Banned forms"):]
    rows = []
    for line in section.splitlines():
        found = ROW_RE.match(line)
        if found and found["banned"] != "banned":
            banned = found["banned"].replace("\\|", "|")  # a pipe inside a table cell is escaped
            rows.append((re.compile(banned, re.IGNORECASE), found["say"], found["scope"]))
    return rows


def scanned() -> list[Path]:
    """The source and the documents the bans hold in: TESTS.md aside, whose lines are the
    tests' own docstrings, and the glossary, which names the forms it bans."""
    files = [path for top in ("sandbox", "mcp_server", "bench") for path in (ROOT / top).rglob("*")
             if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts]
    files += [path for path in (ROOT / "docs").glob("*.md") if path != GLOSSARY]
    files += [path for path in ROOT.glob("*.md") if path.name != "TESTS.md"]
    return sorted(files)


def occurrences() -> dict[tuple[str, str], list[str]]:
    """Every banned form found: (file, form) -> its lines, "LINE: text"."""
    found: dict[tuple[str, str], list[str]] = {}
    files = {path: path.read_text(errors="replace").splitlines() for path in scanned()}
    for form, _say, scope in banned_forms():
        for path, lines in files.items():
            relative = path.relative_to(ROOT).as_posix()
            if scope != "all" and not relative.startswith(scope):
                continue
            for number, line in enumerate(lines, 1):
                if form.search(line):
                    found.setdefault((relative, form.pattern), []).append(f"{number}: {line.strip()[:100]}")
    return found


def test_the_glossary_table_is_read() -> None:
    forms = banned_forms()
    assert len(forms) >= 10, forms
    patterns = [form.pattern for form, _, _ in forms]
    assert len(set(patterns)) == len(patterns), "a form is listed twice"
    for form, say, scope in forms:
        assert say.strip() and (scope == "all" or (ROOT / scope).exists()), (form.pattern, scope)
    listed = {pattern for _, pattern in (*KEPT, *PENDING)}
    assert listed <= set(patterns), f"KEPT or PENDING names forms the glossary no longer bans: {listed - set(patterns)}"


def test_no_banned_form_outside_what_is_kept_or_pending() -> None:
    say = {form.pattern: instead for form, instead, _ in banned_forms()}
    stray = {key: lines for key, lines in occurrences().items() if key not in KEPT and key not in PENDING}
    shown = [f"{path}: {form!r} -> {say[form]}\n    " + "\n    ".join(lines)
             for (path, form), lines in sorted(stray.items())]
    assert not stray, "banned forms (docs/names.md); say instead:\n" + "\n".join(shown)


def test_every_kept_or_pending_entry_still_occurs() -> None:
    gone = (set(KEPT) | PENDING) - set(occurrences())
    assert not gone, f"renamed already: take these out of KEPT or PENDING: {sorted(gone)}"


# NAME = -32xxx, or NAME = framing.NAME (an alias), at the start of a line.
JSON_RPC_CODE_RE = re.compile(r"^(?P<name>[A-Z_]+)\s*(?::[^=]+)?=\s*(?P<value>-32\d{3}|framing\.[A-Z_]+)\b",
                              re.MULTILINE)


def test_each_json_rpc_error_code_is_defined_once() -> None:
    """A module-level constant per JSON-RPC error code, in one module; no alias of another's."""
    defined: dict[str, list[str]] = {}
    for path in scanned():
        if path.suffix != ".py":
            continue
        for found in JSON_RPC_CODE_RE.finditer(path.read_text()):
            assert not found["value"].startswith("framing."), (
                f"{path.relative_to(ROOT)} re-exports {found['value']}: import it from mcp_server.framing")
            defined.setdefault(found["value"], []).append(f"{path.relative_to(ROOT)}: {found['name']}")
    assert defined.get("-32001") == ["mcp_server/framing.py: SHUTTING_DOWN"], defined
    twice = {value: where for value, where in defined.items() if len(where) > 1}
    assert not twice, twice


def test_json_rpcs_own_codes_are_the_sdks_numbers() -> None:
    """framing names JSON-RPC 2.0's codes for a client that does not load the MCP SDK (ccw);
    the server answers with them beside the SDK's own errors, so they must be the same numbers."""
    from mcp import types

    from mcp_server import framing

    for name in ("PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "INTERNAL_ERROR"):
        assert getattr(framing, name) == getattr(types, name), name
