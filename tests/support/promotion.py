"""A workspace and one change to promote into it that holds every kind of op (write, a
new deep file, deletes of a file and a tree, a directory replaced by a file, a symlink, a
chmod): what test_promote_core.py promotes, in process and in a child it kills.

A child process imports it too, with the repository put on its path first.
"""

from __future__ import annotations

from pathlib import Path

from mcp_server.fs.promote import Op


def workspace(tmp_path: Path) -> Path:
    """``tmp_path/ws``, as it is before the change."""
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("old a\n")
    (ws / "src" / "pkg" / "b.py").write_text("old b\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "dir_to_file").mkdir()
    (ws / "dir_to_file" / "inner").write_text("x")
    (ws / "run.sh").write_text("echo\n")
    return ws


CONTENT = {"src/a.py": b"new a\n", "src/new/deep.py": b"deep\n", "dir_to_file": b"now a file\n"}


def change_ops() -> list[Op]:
    """The change: one op of each kind, a directory replaced by a file among them."""
    return [
        Op("write", "src/a.py", 0o644),
        Op("write", "src/new/deep.py", 0o600),
        Op("delete", "gone.txt"),
        Op("delete", "src/pkg"),
        Op("delete", "dir_to_file"),
        Op("write", "dir_to_file", 0o644),
        Op("symlink", "link", target="src/a.py"),
        Op("chmod", "run.sh", 0o755),
    ]


def change_content(op: Op) -> bytes:
    """The bytes a write of the change lands (``Promoter.promote``'s content callback)."""
    return CONTENT[op.path]
