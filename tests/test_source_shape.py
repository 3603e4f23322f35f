"""The shape targets of issue 14: no source file in sandbox/, mcp_server/ or bench/ over 520 lines
(~500 is the aim), no function over 60 lines unless a comment at its top says why it must
be one piece (a ``#`` line containing "one piece", before or just after its first statement).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandbox", "mcp_server", "bench")
MAX_FILE_LINES = 520
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _says_one_piece(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = node.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str)
    first = body[1] if has_docstring and len(body) > 1 else body[0]
    head = lines[node.lineno - 1:first.lineno + 2]
    return any(line.strip().startswith("#") and "one piece" in line for line in head)


def test_no_source_file_is_too_long() -> None:
    long_files = []
    for path in _sources():
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {count} lines")
    assert not long_files, (f"files over {MAX_FILE_LINES} lines (split them along their seams):\n"
                            + "\n".join(long_files))


def test_no_function_is_too_long_without_saying_why() -> None:
    long_functions = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not _says_one_piece(lines, node):
                long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_functions, (
        f"functions over {MAX_FUNCTION_LINES} lines with no '# ... one piece ...' comment at their top:\n"
        + "\n".join(long_functions)
    )
