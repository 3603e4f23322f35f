"""The hints for a git that asked, in a capsule, who is committing, or for an editor.

The jail's $HOME is the capsule's own (``spec.DEFAULT_HOME``), so git there reads the
repository's config and the system's, not the caller's ``~/.gitconfig``: for a user whose
name and email live there (most), ``git commit`` in a capsule stops with "Author identity
unknown" and exit 128.  Showing that file is no answer (it may name credential helpers,
and it lies in the home), so the exec's hint gives the command that sets the two values in
the capsule's own $HOME, which lasts for the capsule's later execs and is never promoted,
with the caller's values when git on the host has them.

An editor: git runs one only on a terminal that is not dumb, or when EDITOR (GIT_EDITOR,
core.editor) names one.  A capsule's exec has no TERM, an interactive one on a terminal
has TERM=dumb (capsules/console.py says why), and the jail passes no EDITOR of the caller,
so ``git rebase -i`` and a ``git commit`` without ``-m`` stop at "Terminal is dumb, but
EDITOR unset".  The way is to name the editor in the command, on a terminal run whose
keys are typed with capsule_run, or to do without one.
"""

from __future__ import annotations

import shlex

from mcp_server.fs.fingerprint import run_git
from sandbox.errors import CcwError

ASKED = b"Please tell me who you are"  # git's ident.c, in the C locale the jail runs with
NO_EDITOR = b"Terminal is dumb, but EDITOR unset"  # git's editor.c: on stdout too, from a terminal run
EDITOR_HINT = ("git found no editor: a capsule's terminal is dumb and EDITOR is unset. Name one in the command and "
               "run it on a terminal, typing the editor's keys (vi: :wq and Enter): sh -c 'GIT_EDITOR=vi git ...' "
               "with tty: true and capsule_run, or ccw capsule exec --interactive --tty; or do without one: "
               "git commit -m MESSAGE, GIT_SEQUENCE_EDITOR='sed -i ...' git rebase -i")
TIMEOUT_S = 5.0
PLACEHOLDERS = {"user.name": "YOUR NAME", "user.email": "you@example.com"}


def hints(workspace: str, stderr: bytes) -> list[str]:
    """The exec's hint when its git found no author identity (else none)."""
    if ASKED not in stderr:
        return []
    values = {key: _caller_value(workspace, key) for key in PLACEHOLDERS}
    setting = " && ".join(f"git config --global {key} {shlex.quote(value or PLACEHOLDERS[key])}"
                          for key, value in values.items())
    whose = ("your values on this host" if all(values.values())
             else "put yours in place of the placeholders")
    return [f"git found no author identity: a capsule's $HOME is its own, without your ~/.gitconfig; "
            f"set it once for this capsule ({whose}; it stays in the capsule's $HOME, never promoted): "
            f"{setting}"]


def _caller_value(workspace: str, key: str) -> str | None:
    """What git on the host, as the caller in ``workspace``, says ``key`` is (None: unset)."""
    try:
        proc = run_git(workspace, "-c", "safe.directory=*", "config", "--get", key, check=False, timeout_s=TIMEOUT_S)
    except CcwError:  # no git here, or it hung: the placeholder stands
        return None
    value = proc.stdout.decode("utf-8", "replace").strip()
    return value if proc.returncode == 0 and value else None
