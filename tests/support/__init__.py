"""What the tests share: helper modules, scripts and servers, kept apart from the tests.

Both suites import from here (``from tests.support import realprojects``); the
conftest.py of each puts the repository on ``sys.path`` (pytest runs with
``--import-mode=importlib``, which adds nothing).  A script that runs one of these as
another user or from a copy passes the repository as its argument and puts it on the
path itself (``agent_loop.SCENARIO``), so it runs this tree's code.

- ``workspaces``: small workspaces of named text files.
- ``cli_process``: the ``ccw`` command as a subprocess on one state dir (``ccw ui`` too).
- ``mcp_process``: a real ``ccw-mcp`` (stdio, unix socket, HTTP) with its logs, and the two
  environments tests start one in: a server test's (``server_env``) and an agent's
  (``agent_server_env``).
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
- ``interactive``: interactive runs driven over MCP, and ``ccw capsule exec --tty`` on a pty.
- ``webdriver``: a small W3C WebDriver client for chromium, and its screenshots;
  ``pages``: a page fetched from the host, as from a forwarded port.
- ``users``: running Python as another uid (``as_user``, ``run_script_as``; ``UserScript``
  for a session a test looks in on between its steps), the interpreter made reachable
  through a private mount namespace.
- ``rootless_jail``: a jail as a rootless helper makes it (``run_rootless``; the ``base``
  fixture).
- ``canary``: a canary beside a workspace and the hostile patches that try to reach it.
- ``call_hooks``: a call as CapsuleService serves it (progress recorded, real turns).
- ``promotion``: a workspace and one change holding every kind of promotion op.
- ``branch_steps``: capsule_promote as_branch's flaskr edits, tree snapshot and ``ccw capsule branch`` session.
- ``journal_rows``: a capsule's record and an exec's entry, for a journal written by hand.
- ``memory_cas``: a CAS in memory, for REAPI tests without a cluster;
  ``reapi_cluster``: what a local cluster needs of the host.
- ``net_probes``: what a program in a jail tries on the network (a script, as text).
- ``lab_names``: real hosts' names answered into a lab namespace (a trio resolver), and a
  script that tries targets through a capsule's proxy.
- ``descriptors``, ``processes``: a descriptor closed, the pids running a command line.
- ``secretsearch``: a secret's bytes looked for in files (their data extents only), the
  journal's events, and from inside a capsule (/proc, /tmp, $HOME, its tree).
- ``bench_smoke``: a benchmark suite's ``--quick`` run, checked to print its table.
- ``jail_parser``: ccw-jail's plan parser built alone under ASan and UBSan (tests/fuzz/jail_plan_harness.c).
- ``scratch_services``: services beside a scratch capsule's runs, the helper's side faked.
- ``helper_wire``: raw bytes to the helper's socket and every reply back (``raw_exchange``).
- ``patch_fuzz``: the check every patch fuzzer makes, and the tree it applies patches to.
- ``textbook_ddmin``: ddmin as Zeller & Hildebrandt wrote it, the searches' reference.

No test module imports another (tests/test_test_map.py checks): what two share is here.
The vm-tests' shared fixtures are vm-tests/conftest.py's, some defined here and
registered there (``users``, ``rootless_jail``).

TESTS.md at the repository's root maps every module of ``sandbox`` and ``mcp_server``
to the tests that cover it.
"""

from __future__ import annotations

from pathlib import Path

# Where the scripts among these modules are, for tests that run or copy them by path.
SUPPORT_DIR = Path(__file__).resolve().parent
