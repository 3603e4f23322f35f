"""witness_base: which base entries a witness carries so that its runs can start again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules.witness_base import Needs, base_entries, base_top
from mcp_server.fs.view import RootView
from sandbox.errors import CcwError


def _tree(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for d in (".venv/bin", ".venv/lib/python3.11/site-packages", ".venv/include", "node_modules/jest/bin",
              "node_modules/.bin", "src", "unused", "out", ".git"):
        (ws / d).mkdir(parents=True)
    (ws / ".venv/pyvenv.cfg").write_text("home = /usr/bin\n")
    os.symlink("python3", ws / ".venv/bin/python")
    os.symlink("/usr/bin/python3", ws / ".venv/bin/python3")
    os.symlink("lib", ws / ".venv/lib64")
    (ws / ".venv/lib/python3.11/site-packages/mod.py").write_text("x = 1\n")
    (ws / "node_modules/jest/bin/jest.js").write_text("#!/usr/bin/env node\n")
    os.symlink("../jest/bin/jest.js", ws / "node_modules/.bin/jest")
    (ws / "unused/big.txt").write_text("never opened\n")
    os.symlink("../unused/big.txt", ws / "src/to-unused")  # inside, to something unused: left out
    os.symlink("missing", ws / "src/dangling")
    (ws / "src/a.py").write_text("import mod\n")
    (ws / "src/b.txt").write_text("listed, not opened\n")
    (ws / "src").chmod(0o750)
    (ws / "tool.sh").write_text(f"#!{ws}/.venv/bin/python\n")
    (ws / "tool.sh").chmod(0o755)
    (ws / ".git/config").write_text("[core]\n")
    return ws


def _entries(ws: Path, needs: Needs, cap: int | None = None) -> dict[str, dict[str, Any]]:
    sizes: list[int] = []

    def add(path: str) -> tuple[str, int]:
        size = (ws / path).stat().st_size
        sizes.append(size)
        return f"blob:{path}", size

    with RootView.open(str(ws)) as view:
        return {e["path"]: e for e in base_entries(view, str(ws), needs, add, cap)}


def _exec(ws: Path, read: list[str] | None, **touched: Any) -> dict[str, Any]:
    return {"argv": touched.pop("argv", ["true"]), "cwd": str(ws / touched.pop("cwd", "")).rstrip("/"),
            "touched": {"read": read, "written": touched.pop("written", []), **touched}}


def test_links_followed_or_leaving_are_carried_unused_ones_are_not(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    execs = [
        _exec(ws, [".venv/pyvenv.cfg", ".venv/lib/python3.11/site-packages/mod.py", "src/a.py"],
              listed=[".venv/lib/python3.11/site-packages"], executed=[], argv=[".venv/bin/python", "src/a.py"]),
        _exec(ws, ["node_modules/jest/bin/jest.js"], executed=["node_modules/jest/bin/jest.js"], listed=[]),
    ]
    got = _entries(ws, Needs.from_journal(str(ws), execs, []))
    owner = {"uid": os.getuid(), "gid": os.getgid()}  # every entry records its owner (capsules/owners.py)
    assert got[".venv/bin/python"] == {"path": ".venv/bin/python", "type": "symlink", "mode": 0o777,
                                       "target": "python3", **owner}
    assert got[".venv/bin/python3"]["target"] == "/usr/bin/python3"  # leaves the workspace: the host has it
    assert got[".venv/lib64"]["target"] == "lib"  # resolves to an ancestor of a file read
    assert got["node_modules/.bin/jest"]["target"] == "../jest/bin/jest.js"
    assert got["src"] == {"path": "src", "type": "dir", "mode": 0o750, **owner}
    assert (got["src/a.py"]["blob"] == "blob:src/a.py"
            and got["src/a.py"]["mtime_ns"] == (ws / "src/a.py").stat().st_mtime_ns)
    assert not {"src/to-unused", "src/dangling", "unused", "unused/big.txt", ".venv/include", "src/b.txt"} & set(got)
    assert not any(p.startswith(".git") for p in got)
    assert list(got) == sorted(got, key=str.encode)


def test_a_listed_directory_brings_its_entries_and_cwds_and_written_dirs_exist(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    execs = [_exec(ws, [], listed=["src"], executed=[], cwd="out", written=["out/new/deep.txt"])]
    got = _entries(ws, Needs.from_journal(str(ws), execs, []))
    assert {"src/a.py", "src/b.txt", "src/to-unused", "src/dangling"} <= set(got)
    assert "unused/big.txt" not in got  # a link in a listed dir is carried as a link only
    assert got["out"]["type"] == "dir"


def test_a_script_interpreter_inside_the_workspace_is_resolved(tmp_path: Path) -> None:
    # The kernel resolves a #! interpreter without any event the tracer could see when it
    # lies elsewhere; here the journal (made up) does not name it, only the #! line does.
    ws = _tree(tmp_path)
    (ws / "tools").mkdir()
    (ws / "tools" / "interp").write_text("not a real interpreter\n")
    os.symlink("tools/interp", ws / "bin-interp")
    (ws / "tool.sh").write_text(f"#!{ws}/bin-interp -x\n")
    execs = [_exec(ws, ["tool.sh"], executed=["tool.sh"], listed=[], argv=["sh", "-c", "./tool.sh"])]
    got = _entries(ws, Needs.from_journal(str(ws), execs, []))
    assert got["tool.sh"]["mode"] == 0o755
    assert got["bin-interp"]["target"] == "tools/interp" and got["tools/interp"]["type"] == "file"


def test_the_listed_root_brings_its_entries(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    got = _entries(ws, Needs.from_journal(str(ws), [_exec(ws, [], listed=["."], executed=[])], []))
    assert {".venv", "node_modules", "src", "unused", "out", "tool.sh"} <= set(got)
    assert ".git" not in got and "unused/big.txt" not in got


def test_changed_paths_are_carried_from_the_base(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    got = _entries(ws, Needs.from_journal(str(ws), [_exec(ws, [], listed=[], executed=[])], ["unused/big.txt"]))
    assert got["unused/big.txt"]["type"] == "file" and got["unused"]["type"] == "dir"


def test_unknown_reads_carry_the_whole_base_but_git(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    got = _entries(ws, Needs.from_journal(str(ws), [_exec(ws, None)], []))
    every = {str(p.relative_to(ws)) for p in ws.rglob("*") if ".git" not in p.parts}
    assert set(got) == every
    with RootView.open(str(ws)) as view:  # asked for: carry "all" with known reads
        known = Needs.from_journal(str(ws), [_exec(ws, [], listed=[], executed=[])], [])
        everything = base_entries(view, str(ws), known, lambda p: ("b", 0), None, carry_all=True)
    assert {e["path"] for e in everything} == every


def test_past_the_cap_the_witness_is_refused_with_the_fix(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    (ws / "unused" / "huge.bin").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(CcwError) as info:
        _entries(ws, Needs.from_journal(str(ws), [_exec(ws, None)], []), cap=1 << 20)
    assert info.value.code == "TOO_LARGE"
    assert "max_base_mb" in info.value.message and "rootless" in info.value.message
    assert info.value.details["at"] == "unused/huge.bin" and info.value.details["read_sets_complete"] is False
    # Without blobs the bytes do not travel, so no cap applies.
    assert "unused/huge.bin" in _entries(ws, Needs.from_journal(str(ws), [_exec(ws, None)], []), cap=None)


def test_the_source_of_each_pyc_read_is_carried(tmp_path: Path) -> None:
    # A valid .pyc is opened; its source is only stat-ed, which no fanotify event shows.
    ws = _tree(tmp_path)
    pkg = ws / ".venv/lib/python3.11/site-packages/pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__pycache__/__init__.cpython-311.pyc").write_bytes(b"pyc")
    (ws / "tests").mkdir()
    (ws / "tests/test_x.py").write_text("def test(): pass\n")
    (ws / "tests/__pycache__").mkdir()
    (ws / "tests/__pycache__/test_x.cpython-311-pytest-9.2.0.pyc").write_bytes(b"rewritten")
    (ws / "__pycache__").mkdir()
    (ws / "__pycache__/tool.cpython-311.opt-1.pyc").write_bytes(b"top")
    (ws / "tool.py").write_text("")
    read = [".venv/lib/python3.11/site-packages/pkg/__pycache__/__init__.cpython-311.pyc",
            "tests/__pycache__/test_x.cpython-311-pytest-9.2.0.pyc", "__pycache__/tool.cpython-311.opt-1.pyc"]
    got = _entries(ws, Needs.from_journal(str(ws), [_exec(ws, read, listed=[], executed=[])], []))
    assert {".venv/lib/python3.11/site-packages/pkg/__init__.py", "tests/test_x.py", "tool.py"} <= set(got)


def test_what_git_commands_used_in_dot_git_travels(tmp_path: Path) -> None:
    ws = _tree(tmp_path)
    (ws / ".git/refs/heads").mkdir(parents=True)
    (ws / ".git/refs/heads/main").write_text("0" * 40 + "\n")
    (ws / ".git/HEAD").write_text("ref: refs/heads/main\n")
    execs = [_exec(ws, [".git/HEAD", ".git/config"], listed=[".git/refs/heads"], executed=[], written=[".git/index"])]
    got = _entries(ws, Needs.from_journal(str(ws), execs, []))
    assert {".git", ".git/HEAD", ".git/config", ".git/refs", ".git/refs/heads", ".git/refs/heads/main"} <= set(got)
    assert got[".git/HEAD"]["blob"] == "blob:.git/HEAD" and got[".git/refs"]["type"] == "dir"


def test_the_top_travels_apart_with_its_mode_and_owner(tmp_path: Path) -> None:
    # The jail's top shows the base top's mode and owner; no entry below it can hold them.
    ws = _tree(tmp_path)
    other = 1234 if os.geteuid() == 0 else os.getuid()
    os.chown(ws, other, other)
    ws.chmod(0o2750)
    with RootView.open(str(ws)) as view:
        assert base_top(view) == {"mode": 0o2750, "uid": other, "gid": other}
    got = _entries(ws, Needs.from_journal(str(ws), [_exec(ws, [], listed=["."], executed=[])], []))
    assert "." not in got and "" not in got
