"""A REAPI cluster for development and CI: private PostgreSQL and BuildGrid on loopback.

Kept apart from ``mcp_server.reapi``, the client every remote trial and replay uses:
``ccw cluster up``, the benches and the tests start this cluster, the product never
needs it (a user points ``CCW_REAPI_URL`` at any REAPI server).
"""
