"""REAPI (Remote Execution API v2) for ccw: the client (issue 17).

- ``protos``: the generated modules, from one place (and why from BuildGrid's package).
- ``merkle``: a directory as a REAPI Directory Merkle tree (SHA-256).
- ``client``: CAS, action cache and Execute over gRPC, blocking; ``TrioReapi`` runs it
  in worker threads for trio code.
- ``worker``, ``inputs``: a Remote Workers API bot session and its side of the CAS.

A client only: the local cluster that development and CI start is ``mcp_server/devcluster/``;
``ccw-bot``, which serves a cluster's leases in capsules, is an
application above the capsule service (mcp_server/bot/), as the executor that sends
deltamin's trials to a cluster is part of it (capsules/remote.py).
"""
