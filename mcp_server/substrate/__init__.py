"""The substrate service: what the file tools do, beneath the MCP tools that offer it.

The snapshot, workspace, hashline and RootSpace tools (``mcp_server/tools/``) are thin
adapters over this package, as the capsule tools are over ``mcp_server/capsules/service.py``:
they parse their arguments, open what only the front end can reach (the caller's
workspace, a capsule's view through the helper, the client's roots), call a function
here in a worker thread and shape its answer.  Nothing here knows MCP: no argument
dicts, no schemas, no tool context.

- ``views``: the live targets (worktree or capsule view) and their fingerprints, the
  stores (blobs, snapshots, leases), reading and capturing files, the answers' types.
- ``snapshot``: snapshot capture and the snapshot reads (list, file, diff, changes,
  export) of a snapshot or a live target under a lease.
- ``search``: grep over a snapshot or a live target (git grep where it can).
- ``patches``: strict patch application and the workspace writes and deletes.
- ``textfiles``: a text file beneath an open view, read with instructive errors and
  replaced only if nobody wrote it since.
- ``hashline``: tagged reads and hash-anchored edits (seed 002), with the tag cache.
- ``rootspace``: root-relative file and text operations (seed 004).
"""
