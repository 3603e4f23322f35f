"""A capsule's network under an allowlist, front-end side: the proxy, SOCKS, the sniffer.

``session.EgressSession`` is what the capsule service uses; the rules are
``mcp_server.core.netrules``.
"""
