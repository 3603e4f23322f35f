"""ccw-bot, an application of its own: a REAPI worker that runs every lease in a capsule (issue 17).

It stands above the capsule service as the tools do (issue 27's layers), and uses the
REAPI client below it (mcp_server/reapi/) as capsules/remote.py does from the other end:

- ``runner``: one lease, fetched, run in a journaled capsule (or a witness replayed),
  its outputs and witness uploaded; the essay on what a lease may do is there.
- ``marker``: what a lease names (its capsule marker, its paths), read as hostile.
- ``__main__``: the ``ccw-bot`` command and its loop of bot sessions.
"""
