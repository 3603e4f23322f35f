"""``ccw-mcp --validate PATH [--schema NAME]``: validate one JSON file and exit (seed 001 §10).

Prints the result as one line of JSON on stdout (the same shape ``validate_asset``
returns) and exits 0 when the file is valid, 1 when it is not (or names no schema),
2 when it cannot be read or is not JSON.  The schema is ``--schema`` if given, else the
file's top-level ``$schemaRef`` (validated as ``nested-<name>``, so the reference itself
is ignored), else a ``$schema`` that names a schema rather than a meta-schema.  Schemas
come from the same place the tools serve them from (``CCW_SCHEMAS_DIR`` or ccw's own).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mcp_server.config import Config
from mcp_server.core.canonical import canonical_text
from mcp_server.core.schema import schema_name_of_ref
from mcp_server.tools.schema import failed, warm

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


def _emit(result: dict[str, Any]) -> None:
    sys.stdout.write(canonical_text(result) + "\n")
    sys.stdout.flush()


def schema_for(asset: Any, explicit: str | None) -> str:
    """The schema to validate ``asset`` against: ``--schema``, ``$schemaRef`` or ``$schema``."""
    if explicit:
        return explicit
    if isinstance(asset, dict):
        named = schema_name_of_ref(asset.get("$schemaRef"))
        if named:
            return f"nested-{named}"
        return schema_name_of_ref(asset.get("$schema"))
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the validation CLI; returns the exit code."""
    parser = argparse.ArgumentParser(prog="ccw-mcp --validate", add_help=False)
    parser.add_argument("--validate", metavar="PATH", required=True)
    parser.add_argument("--schema", metavar="NAME")
    args, _rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    try:
        with open(args.validate, encoding="utf-8") as file:
            asset = json.load(file)
    except (OSError, UnicodeDecodeError) as exc:
        _emit(failed([{"path": "", "msg": f"cannot read {args.validate}: {exc}"}]))
        return EXIT_UNREADABLE
    except ValueError as exc:
        _emit(failed([{"path": "", "msg": f"{args.validate} is not JSON: {exc}"}]))
        return EXIT_UNREADABLE
    try:
        config = Config.from_env()
    except Exception as exc:  # a bad setting is reported, not a traceback
        sys.stderr.write(f"ccw-mcp --validate: {exc}\n")
        return EXIT_UNREADABLE
    catalogue = warm(config, lambda line: sys.stderr.write(line + "\n"))
    schema = schema_for(asset, args.schema)
    if not schema:
        _emit(failed([{"path": "", "msg": "no schema: pass --schema NAME or set $schemaRef in the file"}]))
        return EXIT_INVALID
    errors = catalogue.validate(asset, schema)
    if errors:
        _emit(failed(errors))
        return EXIT_INVALID
    _emit({"ok": True})
    return EXIT_VALID


if __name__ == "__main__":
    sys.exit(main())
