"""What a program in a capsule's jail tries on the network, and what it sees: a script
(``PROBES``, written into the workspace as probes.py) that attempts a denied host through
the proxy, direct TCP and UDP, raw DNS, IPv6, the host's loopback direct and proxied,
link-local addresses and a multicast send, and prints one JSON line per attempt:
``{"case", "ok", "error", "elapsed"}``.  Its arguments: the server's address, the port
of a loopback server on the host.  Sent by vm-tests/test_network_e2e.py (as root) and
test_network_rootless.py (through a rootless helper).
"""

from __future__ import annotations

PROBES = r"""
import json, socket, sys, time, urllib.request, urllib.error
def attempt(case, fn):
    t = time.monotonic()
    try:
        fn(); ok, err = True, None
    except Exception as exc:
        ok, err = False, f"{type(exc).__name__}: {exc}"
    print(json.dumps({"case": case, "ok": ok, "error": err, "elapsed": time.monotonic() - t}), flush=True)
def tcp(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(10); s.connect((host, port)); s.sendall(b"GET / HTTP/1.0\r\n\r\n"); s.recv(10)
def udp(host, port, payload):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(10); s.connect((host, port)); s.send(payload); s.recv(512)
def tcp_scoped(host, port):  # getaddrinfo keeps fe80::1%eth0's scope id
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.settimeout(10); s.connect(socket.getaddrinfo(host, port, socket.AF_INET6)[0][4])
def sent(host, port):  # a group: nothing answers, so only the record shows it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"who?", (host, port))
def proxied(url):
    urllib.request.urlopen(url, timeout=10).read()
server, loop_port = sys.argv[1], int(sys.argv[2])
DNS_QUERY = bytes.fromhex("123401000001000000000000076578616d706c65036f72670000010001")
attempt("denied-host", lambda: proxied("http://denied.example/"))
attempt("direct-tcp", lambda: tcp(server, 8080))
attempt("udp", lambda: udp(server, 9999, b"hello"))
attempt("raw-dns", lambda: udp(server, 53, DNS_QUERY))
attempt("ipv6", lambda: tcp("fd98::2", 80, socket.AF_INET6))
attempt("host-loopback-direct", lambda: tcp("127.0.0.1", loop_port))
attempt("ipv6-link-local", lambda: tcp_scoped("fe80::1%eth0", 80))
attempt("ipv4-link-local", lambda: tcp("169.254.169.254", 80))
sent("224.0.0.251", 5353)
def through_proxy(url):  # urllib would go direct: NO_PROXY names 127.0.0.1
    with socket.create_connection(("10.99.0.1", 3128), timeout=10) as s:
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status = s.recv(4096).split(b"\r\n")[0].decode()
    if " 200 " not in status:
        raise OSError(status)
attempt("host-loopback-proxied", lambda: through_proxy(f"http://127.0.0.1:{loop_port}/"))
"""
