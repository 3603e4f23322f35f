"""REAPI (Remote Execution API v2) for ccw: a client and a local BuildGrid cluster (issue 17).

- ``protos``: the generated modules, from one place (and why from BuildGrid's package).
- ``merkle``: a directory as a REAPI Directory Merkle tree (SHA-256).
- ``client``: CAS, action cache and Execute over gRPC, blocking; ``TrioReapi`` runs it
  in worker threads for trio code.
- ``postgres``, ``cluster``: a private PostgreSQL and BuildGrid on loopback, one command.

A client only: ``ccw-bot``, which serves a cluster's leases in capsules, is an
application above the capsule service (mcp_server/bot/), as the executor that sends
deltamin's trials to a cluster is part of it (capsules/remote.py).
"""
