"""An allowlist capsule's jail looks up its own hostname (``ccw``): git, sudo, ``hostname -f``
and Python's ``socket.getfqdn`` do.  The lookup is no attempt to reach the network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOOKUPS = ("getent hosts ccw; getent ahosts ccw; "
           "/usr/bin/python3 -c 'import socket; print(socket.getfqdn())'; hostname")


def test_a_lookup_of_the_jails_own_hostname_is_no_denied_attempt(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "project"
    ws.mkdir()

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": ["pypi.org:443"]}))["capsule_id"]
        own = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", LOOKUPS]})
        other = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["getent", "hosts", "other.example"]})
        return own, other

    own, other = tools.run(scenario)
    assert own["stdout"].splitlines()[-1] == "ccw"  # the name the jail has, and looked up
    assert own["touched"]["network"] == [] and not own.get("network_notes"), own
    # Any other name the jail resolves itself is still a direct attempt, denied and told.
    [record] = other["touched"]["network"]
    assert (record["protocol"], record["port"], record["allowed"]) == ("udp", 53, False)
    assert other["network_notes"], other
