"""The front end's file substrate I/O: views beneath a root descriptor (``view``), the blob
store, snapshot and lease stores, git (fingerprints, grep), promotion's execution,
witness and export archives, schema and policy files, MCP root resolution.

The pure logic these modules apply is ``mcp_server.core``.
"""
