"""Field paths: ``doc.body`` names the ``body`` key inside the ``doc`` object of a record.

``text_field``, ``id_field`` and every ``keep_fields`` entry are paths. A key whose own name holds a
dot is preferred when the record has it: ``a.b`` is the key ``"a.b"`` when it exists, else ``b``
inside ``a`` (and so on at each level, so ``a.b.c`` also finds ``{"a.b": {"c": …}}``). JSON
objects and Parquet structs are both nested records here: Parquet rows reach this module as
Python dicts, and a struct column is read whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

MISSING: Any = object()
"""What :func:`lookup` gives for a path the record does not have (a null value is ``None``)."""

MAX_PATHS_SHOWN = 40
"""The most field paths an error message lists."""


def lookup(record: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` in ``record``, or :data:`MISSING`; a literal key wins over nesting."""
    if path in record:
        return record[path]
    start = 0
    while (dot := path.find(".", start)) > 0:
        inner = record.get(path[:dot], MISSING)
        if isinstance(inner, Mapping):
            found = lookup(inner, path[dot + 1:])
            if found is not MISSING:
                return found
        start = dot + 1
    return MISSING


def top_column(path: str, names: Iterable[str]) -> str | None:
    """The top-level column that holds ``path`` among ``names``: the path itself, else its shortest
    prefix (at a dot) that is a column; ``None`` when no column can hold it."""
    names = set(names)
    if path in names:
        return path
    for dot, char in enumerate(path):
        if char == "." and path[:dot] in names:
            return path[:dot]
    return None


def schema_type(schema: pa.Schema | pa.StructType, path: str) -> pa.DataType | None:
    """The Arrow type at ``path`` in a Parquet schema (through struct columns), or ``None``."""
    fields = {f.name: f.type for f in schema}
    if path in fields:
        return fields[path]
    start = 0
    while (dot := path.find(".", start)) > 0:
        inner = fields.get(path[:dot])
        if inner is not None and pa.types.is_struct(inner):
            found = schema_type(inner, path[dot + 1:])
            if found is not None:
                return found
        start = dot + 1
    return None


def record_paths(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The field paths seen in ``records``, nested keys as dotted paths, in first-seen order."""
    seen: dict[str, None] = {}
    for record in records:
        _walk(record, "", seen)
    return list(seen)


def schema_paths(schema: pa.Schema | pa.StructType) -> list[str]:
    """The field paths of a Parquet schema, struct members as dotted paths."""
    found: list[str] = []
    for item in schema:
        if pa.types.is_struct(item.type) and item.type.num_fields:
            found += [f"{item.name}.{inner}" for inner in schema_paths(item.type)]
        else:
            found.append(item.name)
    return found


def shown(paths: list[str]) -> str:
    """``paths`` for a message: at most :data:`MAX_PATHS_SHOWN`, or ``none``."""
    if not paths:
        return "none"
    more = len(paths) - MAX_PATHS_SHOWN
    return ", ".join(paths[:MAX_PATHS_SHOWN]) + (f" (and {more} more)" if more > 0 else "")


def _walk(record: Mapping[str, Any], prefix: str, seen: dict[str, None]) -> None:
    for key, value in record.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            _walk(value, f"{path}.", seen)
        else:
            seen[path] = None
