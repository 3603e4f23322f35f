"""A read-only catalogue of JSON Schemas and examples, and Draft 2020-12 validation (seed 001).

Choices, written down because the seed leaves them open:

- **Read once.** Every ``*.json`` under the schemas root and the examples root is read
  when the catalogue is built (process start) and never again; a file that is not JSON
  is left out and named in ``problems``.  Files reached through a symlink that leads
  outside the root are left out too.
- **Name and version.** A schema's name is its file name without ``.json`` and then
  without ``.schema`` (``synesthetic-asset.schema.json`` → ``synesthetic-asset``).  Its
  version is the first of: a string ``version`` (or ``x-version``) keyword, a directory
  in its path that looks like a version (``0.7.3``, ``v2``), else ``"unversioned"``.
  When a name has several versions, ``find`` picks the highest version (numeric parts
  compared as numbers), then the shortest path.
- **Lookup by name or by path.** ``get_schema`` accepts a name, ``nested-<name>`` (seed
  001 §9: the schema ``<name>``) or a path relative to the schemas root; paths are
  checked for traversal (absolute paths, ``..``, backslashes, NUL) before lookup.
- **$ref stays local.** Every schema is a ``referencing`` resource registered under the
  ``file://`` URI of its path and under its ``$id`` (resolved against that URI), so a
  schema without ``$id`` gets its base URI from its file path.  The registry's retrieve
  function refuses every URI it was not given at start: no URL, file or socket is ever
  opened while validating.  (jsonschema's own default registry would fetch remote refs,
  so a validator is never built without ours.)
- **Dialect.** Draft 2020-12 unless the schema's ``$schema`` names another dialect that
  jsonschema knows.  ``format`` is an annotation, as 2020-12 says by default.
- **Errors** are ``{"path", "msg"}``: ``path`` the RFC 6901 pointer of the failing
  instance location (``""`` is the whole asset), ``msg`` jsonschema's message; sorted by
  path, then message, duplicates dropped.
- **nested-<name>** validates against ``<name>`` after dropping a top-level
  ``$schemaRef`` from (a copy of) the asset, so a reference to its own schema never
  trips ``additionalProperties: false``.  Examples are validated the same way.
- **An example's schema** is, in order: its top-level ``$schemaRef`` (or a ``$schema``
  that is not a meta-schema) reduced to a schema name, the name of its directory when a
  schema has that name, or its file name up to ``_``/``.`` turned into kebab case
  (``SynestheticAsset_Example1.json`` → ``synesthetic-asset``).  The component is that
  schema name.
- **Never mutated.** The catalogue hands out deep copies; validation only reads.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_from_bytes, urljoin

import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import exceptions as js_exceptions
from jsonschema.validators import Draft202012Validator, validator_for

from mcp_server.core.jsonpatch import pointer

UNVERSIONED = "unversioned"
NESTED_PREFIX = "nested-"
_VERSION_DIR = re.compile(r"^v?\d+(\.\d+)*$")
_META_SCHEMA_HOST = "json-schema.org"


@dataclass(frozen=True)
class SchemaEntry:
    """One schema: how it is listed, where it lives and the URI its ``$ref``s resolve against."""

    name: str
    version: str
    path: str  # POSIX, relative to its root
    uri: str  # $id resolved against the file URI, or the file URI
    schema: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class ExampleEntry:
    """One example document and the schema it is an example of."""

    component: str
    path: str  # POSIX, relative to the examples root
    schema: str  # schema name, "" when none could be told
    example: Any = field(repr=False, compare=False)


class UnsafePath(ValueError):
    """A path given by a caller tries to leave its root."""


def check_relative_path(path: str) -> str:
    """The caller's path as a normal relative POSIX path, or UnsafePath if it could escape its root."""
    if not path or "\x00" in path or "\\" in path:
        raise UnsafePath(f"{path!r} is not a relative path")
    if path.startswith("/") or ".." in path.split("/"):
        raise UnsafePath(f"{path!r} leaves the configured root")
    return posixpath.normpath(path)


def schema_name_of_file(path: str) -> str:
    """``dir/foo.schema.json`` → ``foo``."""
    parts = _parts(path)
    name = parts[-1] if parts else ""
    name = name.removesuffix(".json")
    return name.removesuffix(".schema")


def _version_key(version: str) -> tuple[int, tuple[tuple[int, str], ...]]:
    if version == UNVERSIONED:
        return (0, ())
    parts = re.split(r"[.\-+]", version.lstrip("v"))
    return (1, tuple((int(p), "") if p.isdigit() else (-1, p) for p in parts))


def _version_of(schema: Any, rel_path: str) -> str:
    if isinstance(schema, dict):
        for key in ("version", "x-version"):
            if isinstance(schema.get(key), str) and schema[key]:
                return str(schema[key])
    for part in _parts(rel_path)[:-1]:
        if _VERSION_DIR.match(part):
            return part
    return UNVERSIONED


def _parts(rel: str) -> tuple[str, ...]:
    # A relative path's components, as pathlib's ``parts`` gives them.
    return tuple(part for part in rel.split("/") if part not in ("", "."))


def _kebab(word: str) -> str:
    word = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", word)
    return word.replace("_", "-").lower()


def schema_name_of_ref(ref: Any) -> str:
    """A ``$schemaRef``/``$schema`` value reduced to a schema name; "" for meta-schemas."""
    if not isinstance(ref, str) or not ref or _META_SCHEMA_HOST in ref:
        return ""
    last = ref.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return schema_name_of_file(last) if last else ""


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    # Everything the catalogue may resolve was registered at start.  Anything else
    # (http(s) URLs, files outside the roots) is refused here, before any I/O.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def _resource(contents: Any) -> referencing.Resource[Any]:
    try:
        return referencing.Resource.from_contents(
            contents, default_specification=referencing.jsonschema.DRAFT202012
        )
    except referencing.exceptions.CannotDetermineSpecification:
        return referencing.jsonschema.DRAFT202012.create_resource(contents)


class SchemaCatalogue:
    """Schemas and examples read at start; listing, lookup and validation."""

    def __init__(
        self,
        schemas: Iterable[SchemaEntry],
        examples: Iterable[ExampleEntry] = (),
        problems: Iterable[str] = (),
        schemas_root: str = "",
        examples_root: str = "",
    ) -> None:
        self.schemas: tuple[SchemaEntry, ...] = tuple(
            sorted(schemas, key=lambda s: (s.name, s.version, s.path))
        )
        self.examples: tuple[ExampleEntry, ...] = tuple(
            sorted(examples, key=lambda e: (e.component, e.path))
        )
        self.problems = tuple(problems)
        self.schemas_root = schemas_root
        self.examples_root = examples_root
        self._by_path = {s.path: s for s in self.schemas}
        self._examples_by_path = {e.path: e for e in self.examples}
        registry: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
        pairs = []
        for entry in self.schemas:
            resource = _resource(entry.schema)
            file_uri = _file_uri(schemas_root, entry.path)
            pairs.append((file_uri, resource))
            if entry.uri != file_uri:
                pairs.append((entry.uri, resource))
        self._registry = registry.with_resources(pairs).crawl()

    # -- building ---------------------------------------------------------------------

    @classmethod
    def from_documents(
        cls,
        schema_documents: Iterable[tuple[str, Any]],
        schemas_root: str,
        example_documents: Iterable[tuple[str, Any]] = (),
        examples_root: str = "",
        problems: Iterable[str] = (),
        extra_schemas: Iterable[SchemaEntry] = (),
        extra_examples: Iterable[ExampleEntry] = (),
    ) -> SchemaCatalogue:
        """A catalogue of documents read from two roots (absolute paths, or ""): each
        ``(relative POSIX path, parsed JSON)`` named and versioned by the rules above."""
        schemas = list(extra_schemas)
        for rel, document in schema_documents:
            file_uri = _file_uri(schemas_root, rel)
            schema_id = document.get("$id") if isinstance(document, dict) else None
            uri = urljoin(file_uri, schema_id) if isinstance(schema_id, str) else file_uri
            uri = uri.rstrip("#")
            schemas.append(SchemaEntry(schema_name_of_file(rel), _version_of(document, rel), rel, uri, document))
        names = {s.name for s in schemas}
        examples = list(extra_examples)
        for rel, document in example_documents:
            schema = _schema_of_example(document, rel, names)
            examples.append(ExampleEntry(schema, rel, schema, document))
        return cls(schemas, examples, problems, schemas_root, examples_root)

    # -- lookup -----------------------------------------------------------------------

    def find(self, name_or_path: str) -> tuple[SchemaEntry | None, bool]:
        """(schema, nested) for a name, ``nested-<name>`` or relative path.

        ``nested`` is True when the caller asked for ``nested-<name>`` and got ``<name>``.
        Raises UnsafePath for a path that tries to leave the schemas root.
        """
        if "/" in name_or_path or name_or_path.endswith(".json") or "\\" in name_or_path:
            return self._by_path.get(check_relative_path(name_or_path)), False
        entry = self._latest(name_or_path)
        if entry is None and name_or_path.startswith(NESTED_PREFIX):
            return self._latest(name_or_path.removeprefix(NESTED_PREFIX)), True
        return entry, False

    def _latest(self, name: str) -> SchemaEntry | None:
        candidates = [s for s in self.schemas if s.name == name]
        if not candidates:
            return None
        return max(candidates, key=lambda s: (_version_key(s.version), -len(s.path), s.path))

    def list_schemas(self) -> list[dict[str, str]]:
        """Every schema as ``{name, version, path}``, sorted by name, version, path."""
        return [{"name": s.name, "version": s.version, "path": s.path} for s in self.schemas]

    def list_examples(self, component: str = "all") -> list[dict[str, str]]:
        """Examples of one component (or ``"all"``) as ``{component, path}``, sorted."""
        return [
            {"component": e.component, "path": e.path}
            for e in self.examples
            if component in ("all", e.component)
        ]

    def example(self, path: str) -> ExampleEntry | None:
        """The example at a relative path; UnsafePath if the path tries to leave the root."""
        return self._examples_by_path.get(check_relative_path(path))

    def schema_copy(self, entry: SchemaEntry) -> Any:
        """A deep copy of a schema, so no caller can change the catalogue."""
        return copy.deepcopy(entry.schema)

    # -- validation -------------------------------------------------------------------

    def validate(self, asset: Any, schema: str) -> list[dict[str, str]]:
        """Validation errors of ``asset`` against the schema named ``schema`` ([] = valid)."""
        if not isinstance(schema, str) or not schema.strip():
            return [{"path": "", "msg": "schema is required: name the schema to validate against"}]
        try:
            entry, nested = self.find(schema)
        except UnsafePath as exc:
            return [{"path": "", "msg": f"schema path rejected: {exc}"}]
        if entry is None:
            return [{"path": "", "msg": f"unknown schema {schema!r}; list_schemas shows the known names"}]
        if nested and isinstance(asset, dict) and "$schemaRef" in asset:
            asset = {k: v for k, v in asset.items() if k != "$schemaRef"}
        return self.validate_entry(asset, entry)

    def validate_entry(self, asset: Any, entry: SchemaEntry) -> list[dict[str, str]]:
        """Validation errors of ``asset`` against one catalogue entry."""
        dialect = entry.schema if isinstance(entry.schema, Mapping) else {}
        validator_cls = validator_for(dialect, default=Draft202012Validator)
        try:
            validator_cls.check_schema(entry.schema)
        except js_exceptions.SchemaError as exc:
            return [{"path": "", "msg": f"schema {entry.path} is not a valid JSON Schema: {exc.message}"}]
        validator = validator_cls({"$ref": entry.uri}, registry=self._registry)
        try:
            errors = {(pointer(tuple(e.absolute_path)), e.message) for e in validator.iter_errors(asset)}
        except referencing.exceptions.Unresolvable as exc:
            return [{"path": "", "msg": "$ref not resolvable inside the configured schema roots "
                                        f"(remote retrieval is refused): {exc}"}]
        return [{"path": p, "msg": m} for p, m in sorted(errors)]


def _file_uri(root: str, rel: str) -> str:
    # Roots are absolute (the catalogue's builder makes them so); "" stands for "/".
    return "file://" + quote_from_bytes(posixpath.join(root or "/", rel).encode("utf-8", "surrogateescape"))


def _schema_of_example(document: Any, rel: str, names: set[str]) -> str:
    if isinstance(document, dict):
        for key in ("$schemaRef", "$schema"):
            name = schema_name_of_ref(document.get(key))
            if name:
                return name
    parts = _parts(rel)
    if len(parts) > 1 and parts[-2] in names:
        return parts[-2]
    stem = re.split(r"[_.]", parts[-1], maxsplit=1)[0]
    return _kebab(stem)
