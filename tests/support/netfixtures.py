"""Test servers for the network tests: a namespace of the test's own, and a loopback service.

Every byte these tests send stays on this machine: the servers listen either on the
host's 127.0.0.1 or inside a network namespace the test creates and removes.  The
server namespace is joined to the host by one veth pair with addresses the tests own
(10.98.0.1 on the host's end, 10.98.0.2 on the server's, a /30), so the front end's
proxy, which connects out from the host's namespace, reaches the servers the way it
would reach a real one, and a jail's direct attempt at 10.98.0.2 is the "bypass the
proxy" case.

- ``ServerNamespace``: the namespace, the veth and ``netservers.py`` running inside it
  (HTTP files and a PEP 503 index, the same over TLS, and a redirector).
- ``make_cert``: a self-signed certificate for 10.98.0.2 made with ``openssl``.
- ``build_wheel``: a tiny pure-Python wheel, zipped by hand (no build backend, so no
  download: pip would fetch setuptools to build one in isolation).
- ``loopback_server``: a TCP service on the host's 127.0.0.1 that a jail must not reach.
- ``HttpLoopback``: an HTTP server on the host's 127.0.0.1 that a capsule's allowlist
  names (reached through the egress proxy): it counts connections and can hold its answers.
- ``banner_servers`` and ``lab_namespace``: for the attacks on the host's own space
  (test_attack_egress.py), TCP services that name themselves, on the host's 0.0.0.0 and
  [::] or in a namespace reached by a veth whose host end has addresses of the test's.

Egress refuses the host's own addresses and private space unless a rule names the
exact address (mcp_server/core/netspace.py), so the network tests allow their servers
by exact-address rules (``10.98.0.2:8080``): those still go through the proxy.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST_ADDRESS = "10.98.0.1"
SERVER_ADDRESS = "10.98.0.2"
HTTP_PORT, HTTPS_PORT, REDIRECT_PORT = 8080, 8443, 8081
SERVER_PYTHON = "/usr/bin/python3"  # the system's, present in every namespace and jail


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def _remove_stale(prefix: str) -> None:
    """Delete the namespaces named ``<prefix><pid>`` of test processes that are gone (a run
    killed before its ``finally``): their veth's host end would keep the fixed address and
    its route, and this run's servers would be refused behind it.  Deleting a namespace
    takes its veth pair with it."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        pid = name[len(prefix):]
        if name.startswith(prefix) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


@dataclass(frozen=True)
class Servers:
    """Where the servers in the namespace answer, and the files they serve."""

    root: Path  # files/ and wheels/ under it
    cert: Path  # the TLS server's certificate (a CA file for clients)
    namespace: str = ""  # the server namespace's name (for ``ip -n``/``tc -n``)
    link: str = ""  # the server's end of the veth, in that namespace

    @property
    def http(self) -> str:
        return f"http://{SERVER_ADDRESS}:{HTTP_PORT}"

    @property
    def https(self) -> str:
        return f"https://{SERVER_ADDRESS}:{HTTPS_PORT}"

    @property
    def redirect(self) -> str:
        return f"http://{SERVER_ADDRESS}:{REDIRECT_PORT}"

    @property
    def index(self) -> str:
        return f"{self.http}/simple/"


@contextlib.contextmanager
def server_namespace(root: Path, redirect_to: str) -> Iterator[Servers]:
    """The server namespace with its veth to the host and the servers running in it; removed after.

    ``root`` holds ``files/`` and ``wheels/`` (made here if absent); the redirector sends
    every request to ``redirect_to``.
    """
    name = f"ccwt{os.getpid()}"
    host_end, server_end = f"ccwh{os.getpid()}"[:15], f"ccws{os.getpid()}"[:15]
    for sub in ("files", "wheels"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    cert, key = make_cert(root / "tls")
    _remove_stale("ccwt")
    _ip("netns", "add", name)
    server = None
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", server_end)
        _ip("link", "set", server_end, "netns", name)
        _ip("addr", "add", f"{HOST_ADDRESS}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", name, "addr", "add", f"{SERVER_ADDRESS}/30", "dev", server_end)
        _ip("-n", name, "link", "set", server_end, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, SERVER_PYTHON, str(HERE / "netservers.py"), "--root", str(root),
             "--http", str(HTTP_PORT), "--https", str(HTTPS_PORT), "--cert", str(cert), "--key", str(key),
             "--redirect", str(REDIRECT_PORT), "--redirect-to", redirect_to],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert server.stdout is not None
        ready = server.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the test servers did not start (said {ready!r}, exit {server.poll()})")
        yield Servers(root, cert, name, server_end)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            for pipe in (server.stdin, server.stdout):
                if pipe is not None:
                    pipe.close()
        # Deleting the namespace removes its veth end, and with it the host's.
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", host_end], capture_output=True, check=False)


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate (and its key) for the server's address; made once per directory."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", "/CN=ccw-test", "-addext", f"subjectAltName=IP:{SERVER_ADDRESS}",
             "-keyout", str(key), "-out", str(cert)],
            capture_output=True, check=True,
        )
        os.chmod(cert, 0o644)
        os.chmod(key, 0o644)  # the server runs as root, clients only need the certificate
    return cert, key


def build_wheel(directory: Path, project: str = "ccwtiny", version: str = "1.0") -> Path:
    """A pure-Python wheel ``project`` whose module says ``hello from <project>``; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{project}-{version}"
    files = {
        f"{project}/__init__.py": f"GREETING = 'hello from {project}'\n".encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: ccw-tests\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    wheel.chmod(0o644)
    return wheel


@contextlib.contextmanager
def loopback_server() -> Iterator[int]:
    """A TCP service on the host's 127.0.0.1 that answers ``host-loopback`` to anyone; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"host-loopback\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


class HttpLoopback:
    """A server on the host's 127.0.0.1 that answers each request ``HTTP/1.0 200`` with ``ok``
    and counts the connections it accepted (``accepted``).  Made ``held``, it answers only once
    ``release`` is set: a run that fetches from it is still running until the test lets it end.
    A context manager; closing releases what it holds."""

    def __init__(self, held: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self.release = threading.Event()
        if not held:
            self.release.set()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            with conn:
                conn.recv(4096)
                self.release.wait(120)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")

    def close(self) -> None:
        """Release any held answer and stop accepting."""
        self.release.set()
        self.sock.close()

    def __enter__(self) -> HttpLoopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


BANNER = """
import socket, sys, threading
label, wanted = sys.argv[1], [int(p) for p in sys.argv[2:]]
listeners = []
for want in wanted:
    v4 = socket.create_server(("0.0.0.0", want))
    port = v4.getsockname()[1]
    v6 = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=False)
    listeners += [(v4, port), (v6, port)]
def serve(listener, port):
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(f"{label}:{port}\\n".encode())
for listener, port in listeners:
    threading.Thread(target=serve, args=(listener, port), daemon=True).start()
print(" ".join(str(port) for _, port in listeners[::2]), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def banner_servers(label: str, ports: list[int], namespace: str | None = None) -> Iterator[list[int]]:
    """TCP services on 0.0.0.0 and [::] at each of ``ports`` (0: any free one) that answer
    ``<label>:<port>`` and close; on the host, or in ``namespace``.  Yields the ports."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    server = subprocess.Popen([*prefix, SERVER_PYTHON, "-c", BANNER, label, *map(str, ports)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        line = server.stdout.readline().split()
        if len(line) != len(ports):
            raise RuntimeError(f"the banner servers did not start (exit {server.poll()})")
        yield [int(port) for port in line]
    finally:
        server.kill()
        server.wait()
        server.stdin.close()
        server.stdout.close()


@dataclass(frozen=True)
class Lab:
    """A namespace behind a veth: the host's end and the namespace's end, with their addresses."""

    namespace: str
    host: tuple[str, ...]
    far: tuple[str, ...]
    far_link: str  # the namespace's end of the veth (to shape what the namespace sends)


@contextlib.contextmanager
def lab_namespace(host: tuple[str, ...], far: tuple[str, ...]) -> Iterator[Lab]:
    """A namespace joined to the host by a veth; ``host`` and ``far`` are the addresses (with
    prefix lengths) of the host's end and the namespace's end.  Removed after."""
    name = f"ccwl{os.getpid()}"
    host_end, far_end = f"ccwlh{os.getpid()}"[:15], f"ccwlf{os.getpid()}"[:15]
    _remove_stale("ccwl")
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", far_end)
        _ip("link", "set", far_end, "netns", name)
        for address in host:
            _ip("addr", "add", address, "dev", host_end, *(["nodad"] if ":" in address else []))
        for address in far:
            _ip("-n", name, "addr", "add", address, "dev", far_end, *(["nodad"] if ":" in address else []))
        _ip("link", "set", host_end, "up")
        _ip("-n", name, "link", "set", far_end, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Lab(name, tuple(a.split("/")[0] for a in host), tuple(a.split("/")[0] for a in far), far_end)
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", host_end], capture_output=True, check=False)


def big_file(root: Path, name: str, size: int) -> Path:
    """A file of ``size`` bytes under the servers' ``files/`` (sparse-free, not all zeros)."""
    path = root / "files" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.stat().st_size != size:
        block = hashlib.sha256(name.encode()).digest() * (1 << 15)  # 1 MiB
        with path.open("wb") as f:
            left = size
            while left > 0:
                f.write(block[:left])
                left -= len(block)
    path.chmod(0o644)
    return path


if __name__ == "__main__":  # a quick manual check: serve until Enter
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, server_namespace(Path(tmp), "http://denied.example/") as s:
        build_wheel(Path(tmp) / "wheels")
        print(s, file=sys.stderr)
        input()
