"""Names and attempts for egress tests in a lab namespace: nothing leaves for the real hosts.

- ``LabResolver(names)``: a trio hostname resolver that answers the test's names (bytes ->
  addresses) as the host's DNS would, and no other; a test installs it in the front end
  (``trio.socket.set_custom_hostname_resolver``) so that the proxy's lookups of real
  hosts' names (pypi.org, a registry) lead into the test's namespace.
- ``THROUGH_PROXY``: a script run in the jail (``python3 -c THROUGH_PROXY JSON``) that makes
  each ``[protocol, target]`` attempt through the capsule's proxy (``http``: CONNECT to
  the HTTP proxy; ``socks``: SOCKS5) and prints ``[protocol, target, what the proxy said,
  what the server behind it answered]`` for each (empty: nothing reached).

Used by vm-tests/test_attack_egress.py and test_network_presets.py.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

import trio

# Runs in the jail: each (protocol, target) through the proxy; what the proxy said and
# what the server behind it answered (empty: nothing reached).
THROUGH_PROXY = r"""
import json, socket, struct, sys
out = []
for protocol, target in json.loads(sys.argv[1]):
    host, port = target.rsplit(":", 1)
    with socket.create_connection(("10.99.0.1", 3128 if protocol == "http" else 1080), timeout=10) as s:
        if protocol == "http":
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                data = s.recv(4096)
                if not data:
                    break
                head += data
            said, rest = head.split(b"\r\n", 1)[0].decode(), head.partition(b"\r\n\r\n")[2]
        else:
            name = host.strip("[]").encode()
            s.sendall(b"\x05\x01\x00\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", int(port)))
            reply = b""
            while len(reply) < 12:
                data = s.recv(64)
                if not data:
                    break
                reply += data
            said, rest = f"socks {reply[3] if len(reply) > 3 else None}", reply[12:]
        banner = b""  # the proxy's own refusal body is not the server's
        if said.endswith(" 200 Connection established") or said == "socks 0":
            banner = rest
            s.settimeout(5)
            while not banner.endswith(b"\n"):
                data = s.recv(100)
                if not data:
                    break
                banner += data
        out.append([protocol, target, said, banner.decode(errors="replace").strip()])
print(json.dumps(out))
"""



class LabResolver(trio.abc.HostnameResolver):
    """The test's names as the host's DNS would answer them; anything else is unknown."""

    def __init__(self, names: Mapping[bytes, Sequence[str]]) -> None:
        self.names = names

    async def getaddrinfo(self, host: bytes | None, port: Any, family: int = 0, type: int = 0,
                          proto: int = 0, flags: int = 0) -> list[Any]:
        if host is None or host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos = []
        for address in self.names[host]:
            v6 = ":" in address
            sockaddr = (address, int(port), 0, 0) if v6 else (address, int(port))
            infos.append((socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM, 6, "", sockaddr))
        return infos

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError
