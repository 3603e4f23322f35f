"""capsule_deltamin's cheap evidence: lines a failing run's output names, and which hunks they point at."""

from __future__ import annotations

from mcp_server.capsules.deltamin import TRACE_WINDOW, _suspects, traced_lines
from mcp_server.capsules.trials import Material, Unit

PYTEST_FAILURE = """\
tests/test_more.py:89:
>               raise ValueError('iterable is not divisible by n.')
E               ValueError: iterable is not divisible by n.

more_itertools/more.py:189: ValueError
"""
PYTHON_TRACEBACK = '''Traceback (most recent call last):
  File "/srv/ws/app/main.py", line 7, in <module>
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
'''
NODE_STACK = """    at stringify (/srv/ws/index.js:30:11)
    at Object.<anonymous> (/srv/ws/test/cmp.js:5:13)
    at node:internal/main/run_main_module:28:49
"""


def test_paths_and_lines_inside_the_workspace_only() -> None:
    assert traced_lines(PYTEST_FAILURE, "/srv/ws", "/srv/ws") == {
        "tests/test_more.py": {89}, "more_itertools/more.py": {189}}
    # Absolute paths outside the workspace (the interpreter's own files) are not the change.
    assert traced_lines(PYTHON_TRACEBACK, "/srv/ws", "/srv/ws") == {"app/main.py": {7}}
    assert traced_lines(NODE_STACK, "/srv/ws", "/srv/ws") == {"index.js": {30}, "test/cmp.js": {5}}


def test_relative_paths_are_read_from_the_run_s_cwd() -> None:
    assert traced_lines("pkg/a.py:3: AssertionError", "/srv/ws", "/srv/ws/sub") == {"sub/pkg/a.py": {3}}
    assert traced_lines("../../etc/x.conf:1: bad", "/srv/ws", "/srv/ws/sub") == {}


def _hunks(*ranges: tuple[str, int, int]) -> Material:
    # (path, first new line (1-based), last new line): hunk = (i1, i2, j1, j2) with new lines j1+1..j2.
    units = [Unit(path, "hunk", hunk=(first - 1, last, first - 1, last)) for path, first, last in ranges]
    return Material(units, {}, {}, {})


def test_a_named_line_points_at_the_hunk_at_or_just_above_it() -> None:
    material = _hunks(("m.py", 3, 3), ("m.py", 188, 188), ("m.py", 400, 402), ("n.py", 189, 189))
    assert _suspects(material, {"m.py": {189}}) == frozenset({1})
    assert _suspects(material, {"m.py": {188 + TRACE_WINDOW}}) == frozenset({1})
    assert _suspects(material, {"m.py": {188 + TRACE_WINDOW + 1}}) is None
    assert _suspects(material, {"m.py": {401}, "n.py": {189}}) == frozenset({2, 3})
    assert _suspects(material, {"other.py": {3}}) is None
