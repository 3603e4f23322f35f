"""Reading a schema catalogue's files: every ``*.json`` under the schemas and examples roots.

Read once, when the catalogue is built (``mcp_server.core.schema`` says why and how
entries are named); a file that is not JSON, or that a symlink takes outside its root,
is left out and named in the catalogue's ``problems``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcp_server.core.schema import ExampleEntry, SchemaCatalogue, SchemaEntry


def read_json_tree(root: Path, problems: list[str]) -> Iterable[tuple[str, Any]]:
    """(relative POSIX path, parsed document) for every ``*.json`` inside ``root``, sorted."""
    real_root = root.resolve()
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            if not filename.endswith(".json"):
                continue
            file = Path(dirpath) / filename
            if not file.resolve().is_relative_to(real_root):
                problems.append(f"{file}: symlink leaves {root}; skipped")
                continue
            found.append((file.relative_to(root).as_posix(), file))
    for rel, file in sorted(found):
        try:
            yield rel, json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            problems.append(f"{file}: not readable JSON ({exc}); skipped")


def catalogue_from_dirs(
    schemas_dir: str,
    examples_dir: str = "",
    extra_schemas: Iterable[SchemaEntry] = (),
    extra_examples: Iterable[ExampleEntry] = (),
) -> SchemaCatalogue:
    """Read every ``*.json`` under the two roots (either may be "" or missing)."""
    problems: list[str] = []
    schema_documents: list[tuple[str, Any]] = []
    if schemas_dir and Path(schemas_dir).is_dir():
        schema_documents = list(read_json_tree(Path(schemas_dir).absolute(), problems))
    example_documents: list[tuple[str, Any]] = []
    if examples_dir and Path(examples_dir).is_dir():
        example_documents = list(read_json_tree(Path(examples_dir).absolute(), problems))
    return SchemaCatalogue.from_documents(
        schema_documents,
        str(Path(schemas_dir).absolute()) if schemas_dir else "",
        example_documents,
        str(Path(examples_dir).absolute()) if examples_dir else "",
        problems,
        extra_schemas,
        extra_examples,
    )
