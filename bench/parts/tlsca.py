"""What the TLS CA of issue 38 costs (core/tlsca.py): making the CA, issuing a leaf, loading a leaf's
server context, each beside one TLS handshake with such a leaf, measured in the same run.

The handshake is the baseline because it is what every terminated connection pays anyway: a
leaf is issued once per host and cached (``LeafCache``), the CA once per set of bound hosts,
so what matters is how they compare with one handshake.  Client and server talk through
memory BIOs in this thread, so the figure is the handshake's CPU alone, with no socket or
scheduler in it.  ``python bench/parts/tlsca.py`` prints the rows.
"""

from __future__ import annotations

import datetime as dt
import ssl
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import Report, Row, interleaved, median_ms
from mcp_server.core.tlsca import make_authority
from mcp_server.fs.castore import server_context

HOSTS = ["git.test", "pypi.test", "models.test"]


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """One full TLS handshake between ``client`` and ``server`` through memory BIOs."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=HOSTS[0])
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    while not all(done.values()):
        for name, side in (("client", tls_client), ("server", tls_server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())


def measure(repeat: int) -> list[Row]:
    """The CA's rows: each cost beside one handshake, medians of ``repeat`` interleaved rounds."""
    now = dt.datetime.now(dt.UTC)
    authority = make_authority(HOSTS, now)
    leaf = authority.leaf(HOSTS[0], now)
    server = server_context(leaf)
    with tempfile.TemporaryDirectory(prefix="ccw-bench-tlsca-") as tmp:
        (Path(tmp) / "ca.pem").write_bytes(authority.cert_pem())
        client = ssl.create_default_context(cafile=str(Path(tmp) / "ca.pem"))
    times = interleaved({
        "ca": lambda: make_authority(HOSTS, now),
        "leaf": lambda: authority.leaf(HOSTS[0], now),
        "context": lambda: server_context(leaf),
        "handshake": lambda: _handshake(server, client),
    }, repeat)
    handshake = median_ms(times["handshake"])
    return [Row(f"TLS CA made (P-256, {len(HOSTS)} names constrained)", median_ms(times["ca"]),
                "one TLS handshake", handshake, "(no target: once per set of bound hosts)"),
            Row("TLS leaf issued for a bound host", median_ms(times["leaf"]), "one TLS handshake", handshake,
                "(no target: once per host per day, cached)"),
            Row("TLS leaf's server context loaded (memfd)", median_ms(times["context"]), "one TLS handshake",
                handshake, "(no target)")]


if __name__ == "__main__":
    report = Report("tlsca")
    report.rows.extend(measure(200))
    print(report.to_text())
