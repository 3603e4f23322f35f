"""What the tests share: helper modules, scripts and servers, kept apart from the tests.

Both suites import from here (``from tests.support import realprojects``); the
conftest.py of each puts the repository on ``sys.path`` (pytest runs with
``--import-mode=importlib``, which adds nothing).  A script that runs one of these as
another user or from a copy passes the repository as its argument and puts it on the
path itself (``agent_loop.SCENARIO``), so it runs this tree's code.

- ``workspaces``: small workspaces of named text files.
- ``cli_process``: the ``ccw`` command as a subprocess on one state dir.
- ``mcp_process``: a real ``ccw-mcp`` (stdio, unix socket, HTTP) with its logs.
- ``raw_mcp``: a raw newline-delimited JSON-RPC client of ``ccw-mcp`` over stdio.
- ``witness_craft``: witnesses written by hand, for the format and attack tests.
- ``egress_harness``: an egress session on loopback sockets, with upstream servers.
- ``egress_scenario``: test_egress_kernel.py's scenario, run as its own process (a script).
- ``netfixtures``: a network namespace of the test's own and loopback services;
  ``netservers``: the servers it starts inside that namespace (a script).
- ``escape_probes``: escape attempts a shell cannot make, copied into a jail (a script).
- ``realprojects``: real published projects, fetched once and copied per test;
  ``agent_loop``: the agent's loop on one of them through ccw's tools.
- ``reapi_bot``: a plain-subprocess REAPI bot, for the REAPI client's tests.
- ``shell_session``: ``ccw capsule shell`` driven through a pty (also a script).
- ``webdriver``: a small W3C WebDriver client for chromium.
- ``users``: running Python as another uid (``as_user``, ``run_script_as``), the
  interpreter made reachable through a private mount namespace.

TESTS.md at the repository's root maps every module of ``sandbox`` and ``mcp_server``
to the tests that cover it.
"""

from __future__ import annotations

from pathlib import Path

# Where the scripts among these modules are, for tests that run or copy them by path.
SUPPORT_DIR = Path(__file__).resolve().parent
