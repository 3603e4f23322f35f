"""Tool names in what ``ccw`` prints, said as the ``ccw`` command that does the same.

The front end's errors and notes are written for an agent, so they name the tool to call
next ("call capsule_list to see live capsules"); the same text reaches a person at ``ccw``
(``main``'s ``ccw: CODE: message``, a diff's notes, an exec's hints), who has commands, not
tools.  ``COMMANDS`` is the one table from a tool to its command; tests/test_cli_toolwords.py
parses each command with the CLI's own parser and checks that it calls that tool, so it
names no command that does not exist.  The MCP answers are never changed: only the line
printed is.

``in_cli_words`` leaves a tool that has no command as it is (capsule_run: a command waits
for its run itself), and a tool whose command the text names already (a message written
for both, such as a rename's "capsule_exec with cmd [...], or ccw capsule exec ...").
"""

from __future__ import annotations

import re

COMMANDS = {
    "capsule_create": "ccw capsule create",
    "capsule_exec": "ccw capsule exec",
    "capsule_diff": "ccw capsule diff",
    "capsule_promote": "ccw capsule promote",
    "capsule_witness": "ccw capsule witness",
    "capsule_replay": "ccw capsule replay",
    "capsule_list": "ccw capsule list",
    "capsule_destroy": "ccw capsule destroy",
    "capsule_fork": "ccw capsule fork",
    "capsule_deltamin": "ccw capsule deltamin",
    "capsule_race": "ccw capsule race",
    "capsule_merge": "ccw capsule merge",
    "capsule_network": "ccw capsule net",
    "capsule_port": "ccw capsule port",
    "capsule_pause": "ccw capsule pause",
    "capsule_resume": "ccw capsule resume",
    "capsule_service_start": "ccw capsule service start",
    "capsule_service_list": "ccw capsule service list",
    "capsule_service_logs": "ccw capsule service logs",
    "capsule_service_stop": "ccw capsule service stop",
}

# "call TOOL" becomes "run COMMAND"; a tool name is whole (\b: "capsule_list" is not in
# "capsule_list_x"), the longest first.
_NAMED = re.compile(r"\b(?:(call) )?(" + "|".join(sorted(COMMANDS, key=len, reverse=True)) + r")\b")


def in_cli_words(text: str) -> str:
    """``text`` with each tool that has a command, and whose command it does not name already, named
    by its command."""
    def said(found: re.Match[str]) -> str:
        command = COMMANDS[found[2]]
        if command in text:
            return found[0]
        return f"run {command}" if found[1] else command

    return _NAMED.sub(said, text)
