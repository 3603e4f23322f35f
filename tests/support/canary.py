"""A canary beside a workspace, the patches that try to reach it, and a digest that shows
it untouched: issue 9's attacks on workspace_apply_patch, made once and sent by
tests/test_attack_patches.py (to the tool in process), tests/test_attack_server.py (through
a server) and vm-tests/test_attack_capsules.py (to a capsule); tests/test_attack_tools.py
uses the digest for its own canary.

``plant`` lays the canary (a directory holding ``SECRET``) and symlinks to it inside the
workspace; ``hostile_patches(canary)`` names each patch that tries to write, read, rename
or copy through them or by a name that leaves the tree; ``tree_digest`` is what must stay
the same.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SECRET = "CANARY-SECRET do not touch"


def hostile_patches(canary: str) -> dict[str, str]:
    """Name -> patch text; ``canary`` is the absolute path of the directory to protect."""
    new = "new file mode 100644\n--- /dev/null\n"
    add = "@@ -0,0 +1 @@\n+PWNED\n"
    edit = f"@@ -1 +1 @@\n-{SECRET}\n+PWNED\n"
    return {
        "dotdot_both": f"--- a/../canary/secret.txt\n+++ b/../canary/secret.txt\n{edit}",
        "dotdot_deep": f"--- a/src/../../canary/secret.txt\n+++ b/src/../../canary/secret.txt\n{edit}",
        "a_dotdot": f"--- /dev/null\n+++ a/../../x\n{add}",
        "absolute_new": f"--- /dev/null\n+++ /etc/ccw-attack\n{add}",
        "absolute_canary": f"--- {canary}/secret.txt\n+++ {canary}/secret.txt\n{edit}",
        "absolute_canary_new": f"--- /dev/null\n+++ {canary}/new.txt\n{add}",
        "no_prefix_dotdot": f"--- /dev/null\n+++ ../canary/new.txt\n{add}",
        "git_header_dotdot": f"diff --git a/x b/../x\n{new}+++ b/../x\n{add}",
        "git_header_mismatch": f"diff --git a/ok.txt b/ok.txt\n{new}+++ b/../../canary/new.txt\n{add}",
        "git_quoted_octal": f'diff --git "a/\\056\\056/x" "b/\\056\\056/x"\n{new}+++ "b/\\056\\056/x"\n{add}',
        "quoted_dotdot": f'--- /dev/null\n+++ "b/../canary/new.txt"\n{add}',
        "tilde": f"--- /dev/null\n+++ b/~/x\n{add}",
        "windows": f"--- /dev/null\n+++ b/..\\..\\canary\\new.txt\n{add}",
        "drive": f"--- /dev/null\n+++ b/C:\\x\n{add}",
        "nul_in_name": f"--- /dev/null\n+++ b/a\\000b\n{add}",
        "symlink_then_write": (
            "diff --git a/lnk b/lnk\nnew file mode 120000\n--- /dev/null\n+++ b/lnk\n"
            f"@@ -0,0 +1 @@\n+{canary}\n\\ No newline at end of file\n"
            f"diff --git a/lnk/evil b/lnk/evil\n{new}+++ b/lnk/evil\n{add}"
        ),
        "rel_symlink_then_write": (
            "diff --git a/up b/up\nnew file mode 120000\n--- /dev/null\n+++ b/up\n"
            "@@ -0,0 +1 @@\n+..\n\\ No newline at end of file\n"
            f"diff --git a/up/canary/new.txt b/up/canary/new.txt\n{new}+++ b/up/canary/new.txt\n{add}"
        ),
        "rename_out": "diff --git a/src/a.txt b/../moved\nsimilarity index 100%\n"
                      "rename from src/a.txt\nrename to ../moved\n",
        "rename_into_canary": (
            "diff --git a/src/a.txt b/out/moved\nsimilarity index 100%\nrename from src/a.txt\nrename to out/moved\n"
        ),
        "rename_header_mismatch": (
            "diff --git a/src/a.txt b/src/b.txt\nsimilarity index 100%\nrename from src/a.txt\n"
            "rename to ../../canary/moved\n"
        ),
        "copy_from_canary": "diff --git a/outfile b/stolen\nsimilarity index 100%\ncopy from outfile\ncopy to stolen\n",
        "copy_from_dotdot": "diff --git a/x b/stolen\nsimilarity index 100%\n"
                            "copy from ../canary/secret.txt\ncopy to stolen\n",
        "edit_through_file_link": f"--- a/outfile\n+++ b/outfile\n{edit}",
        "edit_through_dir_link": f"--- a/out/secret.txt\n+++ b/out/secret.txt\n{edit}",
        "create_through_dir_link": f"--- /dev/null\n+++ b/out/new.txt\n{add}",
        "create_through_rel_link": f"--- /dev/null\n+++ b/rel/new.txt\n{add}",
        "delete_through_link": f"--- a/out/secret.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-{SECRET}\n",
        "delete_the_link_target": f"--- a/outfile\n+++ /dev/null\n@@ -1 +0,0 @@\n-{SECRET}\n",
        "mode_change_link": "diff --git a/outfile b/outfile\nold mode 120000\nnew mode 100644\n",
        "mode_change_through_link": "diff --git a/out/secret.txt b/out/secret.txt\nold mode 100644\nnew mode 100755\n",
        "binary_out": (
            "diff --git a/../bin b/../bin\nnew file mode 100644\nindex 0000000..f9e4e7a\n"
            "GIT binary patch\nliteral 5\nMcmZ?wbaHd^00Ahz0RR91\n\nliteral 0\nHcmV?d00001\n\n"
        ),
        "dir_then_file": (
            f"--- /dev/null\n+++ b/d/x\n{add}--- /dev/null\n+++ b/d/../../canary/new.txt\n{add}"
        ),
        "empty_name": f"--- /dev/null\n+++ b/\n{add}",
        "dot_name": f"--- /dev/null\n+++ b/.\n{add}",
        "git_dir": f"--- /dev/null\n+++ b/.git/hooks/pre-commit\n{add}",
    }


def tree_digest(root: Path, skip: tuple[str, ...] = ()) -> str:
    """sha256 over names, modes, link targets and bytes of everything under ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (here == root and d in skip))
        for name in sorted(dirnames + filenames):
            path = here / name
            h.update(f"{path.relative_to(root)}\0{path.lstat().st_mode:o}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            elif path.is_file():
                h.update(path.read_bytes())
    return h.hexdigest()


def plant(ws: Path, canary: Path) -> None:
    """A canary beside the workspace and symlinks in the workspace that point at it."""
    canary.mkdir()
    (canary / "secret.txt").write_text(SECRET + "\n")
    (ws / "src").mkdir(parents=True, exist_ok=True)
    (ws / "src" / "a.txt").write_text("inside\n")
    os.symlink(str(canary), ws / "out")
    os.symlink(str(canary / "secret.txt"), ws / "outfile")
    os.symlink("../canary", ws / "rel")
