"""The front end's pure logic: paths, patches, hashlines, manifests, policies, schemas.

Nothing here does I/O (no files, processes, sockets, threads or helper calls; checked by
the ``core-does-no-io`` import-linter contract in pyproject.toml): callers hand in bytes
and facts and get values back.  The I/O around it is ``mcp_server.fs``.
"""
