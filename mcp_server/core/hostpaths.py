"""Host paths a caller names (a workspace, a base, a directory to expose, a witness file): absolute, UTF-8.

Some facts about the paths callers send:

- Over MCP a relative path would be taken from the front end's working directory: the
  state dir's one front end (mcp_server/frontdoor.py) serves many clients, none of which
  chose that directory or can see it.  So a relative host path is refused, naming the
  argument.  ``ccw`` makes its paths absolute itself (cli/capsule.py), from its own cwd.
- Linux names are bytes; Python reads a name that is not UTF-8 (``os.mkdir(b"w\\xff")``)
  as text with lone surrogates (surrogateescape).  ccw carries paths as text: JSON on
  every wire (MCP's lines, the helper's frames), the journal's rows.  No JSON encoder
  writes a lone surrogate as UTF-8, so such a path used to fail deep in the helper's
  framing (sandbox/protocol.py), with a message about canonical JSON and not the path.
  It is refused where the argument is taken, naming it and its bytes.
- The way out is a UTF-8 name for the directory itself: renaming it (or the directory
  in its path whose name holds the bytes).  A UTF-8 symlink does not help, because a
  workspace, base or exposed directory is resolved (``realpath``) to its real name
  before anything is made of it.  Nor does a bind mount at a UTF-8 path made while a
  helper runs: the helper works in the mount namespace it started in, which does not
  see it (measured: the capsule was made, over an empty directory).
"""

from __future__ import annotations

from sandbox.errors import CcwError


def shown(path: str) -> str:
    """``path`` as UTF-8 text, each byte that is not UTF-8 written ``\\xff`` (a lone surrogate
    that stands for no byte, from a JSON ``\\ud800``, written ``\\ud800``)."""
    try:
        data = path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return data.decode("utf-8", "backslashreplace")


def absolute(path: str, argument: str) -> str:
    """``path`` if absolute; INVALID_ARGUMENT naming ``argument`` if relative."""
    if not path.startswith("/"):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"{argument} '{shown(path)}' is a relative path; give an absolute one (a relative path would be taken "
            "from the ccw front end's working directory, not yours)",
            {"argument": argument, "path": shown(path)},
        )
    return path


def is_utf8(path: str) -> bool:
    """True when ``path`` is text every wire carries: no lone surrogate (a byte that is not UTF-8)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8(path: str, argument: str) -> str:
    """``path`` if its name is UTF-8 text; INVALID_ARGUMENT naming ``argument`` and the way out if not."""
    if not is_utf8(path):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"{argument} '{shown(path)}' is not UTF-8 text, and ccw carries paths as UTF-8; rename the directory "
            "whose name holds those bytes to a UTF-8 name (a symlink does not help: ccw resolves the path to its "
            "real name)",
            {"argument": argument, "path": shown(path)},
        )
    return path
