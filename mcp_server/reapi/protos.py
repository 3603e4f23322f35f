"""REAPI's generated modules, in one place: every other module of the package imports them from here.

Where they come from, and why.  The Remote Execution API is a set of ``.proto`` files
(bazelbuild/remote-apis, plus googleapis' ``bytestream``, ``longrunning``, ``rpc`` and
``devtools/remoteworkers``).  Two ways to have them in Python were weighed (issue 17):

- **A maintained package with the generated modules.**  BuildGrid publishes its own,
  ``buildgrid-common``: ``buildgrid.common.protos`` holds REAPI v2, ByteStream,
  longrunning Operations, google.rpc Status and the Remote Workers API (``bots``,
  needed by ccw-bot), with ``.pyi`` type stubs.  Its 0.5.x line is the last for Python
  3.10-3.11 (0.6 on need 3.12; ccw runs on 3.11), and 0.5.2's generated code loads and
  round-trips under protobuf 7.36 and grpcio 1.85 with warnings as errors (it calls no
  gencode version check, so a newer runtime does not warn).  It brings grpcio, protobuf,
  pydantic (ccw has it through mcp) and ruamel.yaml.
- **Generating at build time** with grpcio-tools from the protos.  That needs the
  protos in the tree (REAPI's and about ten of googleapis' they import) and
  grpcio-tools in the build requirements (1.85.1 requires protobuf >= 7.35.1, < 8), and
  the generated code then checks at import that the runtime is not older than protoc.

The package wins: nothing to vendor or generate, the stubs are the ones BuildGrid's
own server is built from, and it covers the bots API.  Its cost, and the way out:
it is frozen at 0.5.x while ccw supports 3.11, and its ``google/rpc/status.proto``
registers in protobuf's default pool under the same file name as
googleapis-common-protos' (so the two cannot be imported into one process; ccw imports
neither elsewhere).  Should either bite, generate from the protos instead and change
only the imports below.
"""

from __future__ import annotations

from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid.common.protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from buildgrid.common.protos.google.devtools.remoteworkers.v1test2 import (
    bots_pb2,
    bots_pb2_grpc,
    worker_pb2,
)
from buildgrid.common.protos.google.longrunning import operations_pb2, operations_pb2_grpc
from buildgrid.common.protos.google.rpc import code_pb2, status_pb2

__all__ = [
    "bots_pb2",
    "bots_pb2_grpc",
    "bytestream_pb2",
    "bytestream_pb2_grpc",
    "code_pb2",
    "operations_pb2",
    "operations_pb2_grpc",
    "re_grpc",
    "re_pb2",
    "status_pb2",
    "worker_pb2",
]
