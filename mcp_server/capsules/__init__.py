"""The front end's capsule service: what the capsule tools, deltamin, replay and promotion share.

``service.CapsuleService`` is the one way to make, run, fork, diff, list and destroy a
capsule: it talks to the helper in typed requests and replies (``sandbox.ops``,
``sandbox.replies``), keeps the journal (execs, file-tool writes, base states, the
change generation) and takes each capsule's turn (``turns``).  The tool modules in
``mcp_server/tools`` are thin adapters over it (``ctx.capsules``).  Beside it, one module
per job: ``runs`` (one exec: its request, environment, outcome and journal entry), ``notes``
(journal notes of changes seen), ``witness`` and ``witness_base`` (building and storing
witness archives), ``replay`` (re-running one), ``trials`` and ``deltamin``,
``commutativity``, ``promote`` and ``policy`` (capsule_promote, the policy tools), and
``fragments`` (the JSON-Schema pieces of the identifiers the tools share).  Each job's
module has its tool's name, as on every other floor (tools/, fs/, core/).
"""
