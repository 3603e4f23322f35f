"""``bench/run.py network --smoke`` runs to its table (issue 40), every row's code and its
baseline reached at smoke sizes (no timing asserted).  Apart from test_bench_smoke.py: it
puts a veth on netfixtures' fixed addresses, so it runs on the worker of the other
vm-tests that do (vm-tests/conftest.py SHARED); run it by hand under /tmp/ccw-net.lock."""

from __future__ import annotations

from tests.support.bench_smoke import assert_rows, run_quick

NONE, HOST, BEFORE = "network none", "host direct", "before live rules"
HANDSHAKE, TUNNEL = "one TLS handshake", "same, CONNECT tunnel"


def test_network_smoke_run_prints_every_row(root_required: None) -> None:
    assert_rows(run_quick("network", smoke=True), [
        ("capsule create, allowlist", NONE),
        ("create + first exec /bin/true, allowlist", NONE),
        ("exec /bin/true, allowlist", NONE),
        ("HTTP download 1 MiB via proxy (s/GiB)", HOST),
        ("HTTP download 1 MiB via proxy, server link shaped to 1 Gbit/s (s/GiB)", HOST),
        ("CONNECT allowed by the rules, live-rule machinery", BEFORE),
        ("CONNECT denied by the rules, live-rule machinery", BEFORE),
        ("TLS CA made (P-256, 3 names constrained)", HANDSHAKE),
        ("TLS leaf issued for a bound host", HANDSHAKE),
        ("TLS leaf's server context loaded (memfd)", HANDSHAKE),
        ("HTTPS download 1 MiB, TLS terminated (s/GiB)", TUNNEL),
        ("HTTPS download 1 MiB, TLS terminated, server link shaped to 1gbit (s/GiB)", TUNNEL),
        ("HTTPS small request (one of 5, a connection each), TLS terminated", TUNNEL),
    ])
