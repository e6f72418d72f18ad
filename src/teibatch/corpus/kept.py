"""The types of kept fields: one Arrow type per field for the whole output, decided before any shard runs.

An output's parts must agree on every column's type, across all its parts and all its runs, but a
shard sees only its own records. So the types are decided once, by the driver, from what planning
reads anyway — the probe's sample (``probe.py``) and every Parquet file's column types — and each
value is then checked against its field's type as it is read (``documents.py``):

* ``strict`` (the default): a field takes the type its values have: int64, float64, bool, string,
  list or struct (ints and floats mixed: float64; nulls fit any type; a field with no value in the
  sample: string; a Parquet column its own type). When the types seen disagree, the field is
  *stringified* — written as JSON text — and the run says so once per field. A later value that
  does not fit its field's type stops its shard (``CorpusMismatch``, exit code 2): it is never
  changed silently.
* ``stringify``: every field of a JSON, CSV or builtin corpus is stringified; a Parquet column keeps
  its type (Parquet files that disagree on it are a ``CorpusError``). This is how outputs written
  before kept-field types existed were made, and such outputs keep it.

``KeptFields`` is the decision; it goes to the shard tasks and into the output's manifest.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, TypeAlias

import orjson
import pyarrow as pa

from teibatch.corpus.formats import detect_format
from teibatch.corpus.listing import list_sources, resolve_root
from teibatch.corpus.paths import schema_type
from teibatch.corpus.readers import parquet_schema
from teibatch.corpus.records import KEEP_FIELDS_STRINGIFY, CorpusOptions
from teibatch.errors import CorpusError, CorpusMismatch

_INT64 = (-(2**63), 2**63 - 1)


class _Mixed:
    """The merge of types that cannot share a column."""


MIXED = _Mixed()
Inferred: TypeAlias = "pa.DataType | _Mixed"


@dataclass(frozen=True)
class FieldSample:
    """What the probe's sample says of one kept field: the type its values share (``MIXED`` when
    they disagree; ``null`` when none has a value) and the distinct types seen, by name."""

    type: Inferred
    seen: tuple[str, ...] = ()


def sample_type(sample: FieldSample) -> str:
    """The type ``strict`` gives a field on the sample's evidence alone, for ``teibatch validate``."""
    kind = _finish(sample.type)
    return f"JSON text ({', '.join(sample.seen)} disagree)" if isinstance(kind, _Mixed) else type_name(kind)


@dataclass(frozen=True)
class Stringified:
    """A field ``strict`` writes as JSON text because the types seen disagree: ``seen`` says which, and where."""

    field: str
    seen: tuple[str, ...]

    def message(self) -> str:
        return (f"kept field {self.field!r} holds values of more than one type ({'; '.join(self.seen)}): "
                "it is written as JSON text in this output (corpus.keep_fields_types)")


@dataclass(frozen=True)
class KeptFields:
    """How each kept field is written: ``types`` (in ``keep_fields`` order) and which are ``stringified``."""

    rule: str
    types: dict[str, pa.DataType] = field(default_factory=dict, hash=False)
    stringified: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        """The manifest's record (readable types beside the exact Arrow schema)."""
        schema = pa.schema([pa.field(name, kind) for name, kind in self.types.items()])
        return {"rule": self.rule, "types": {name: type_name(kind) for name, kind in self.types.items()},
                "stringified": sorted(self.stringified),
                "schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeptFields:
        """The record :meth:`to_json` wrote."""
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"])))
        return cls(str(data["rule"]), {f.name: f.type for f in schema}, frozenset(data.get("stringified", ())))


def check_columns(kept: KeptFields, options: CorpusOptions, files: Iterable[str] | None = None) -> None:
    """Refuse (``CorpusMismatch``) a Parquet column whose values the output's type for it cannot hold.

    Kept types recorded by an earlier run hold whatever the corpus has become since; a Parquet
    file's values are not checked one by one, so its column type is checked here, before any work.
    """
    for name, found in parquet_field_types(options, files).items():
        if name in kept.stringified:
            continue
        for kind, path in found:
            if merge(kept.types[name], kind) != kept.types[name]:
                raise CorpusMismatch(
                    f"column {name!r} is {type_name(kind)}, but this output's kept field {name!r} is "
                    f"{type_name(kept.types[name])} (recorded when it was first written); fix the file, or write to "
                    "a new output.path", file=path, field=name)


def decide_kept_fields(options: CorpusOptions, rule: str, samples: Mapping[str, FieldSample], sample_file: str,
                       files: Iterable[str] | None = None) -> tuple[KeptFields, list[Stringified]]:
    """The output's kept-field types under ``rule`` (module doc), and the fields stringified for disagreeing.

    ``samples``: what the probe saw in ``sample_file`` (nothing when it sampled a Parquet file);
    ``files``: the corpus's source paths (``None`` lists the corpus), for their Parquet column types.
    """
    columns = parquet_field_types(options, files)
    types: dict[str, pa.DataType] = {}
    if rule == KEEP_FIELDS_STRINGIFY:
        types = _stringify_types(columns)
        return KeptFields(rule, types, frozenset(name for name in types if not columns[name])), []
    stringified: list[Stringified] = []
    for name in options.keep_fields:
        found: list[tuple[Inferred, str]] = [(kind, f"{type_name(kind)} in {path}") for kind, path in columns[name]
                                             if not pa.types.is_null(kind)]
        sample = samples.get(name)
        if sample is not None and sample.seen:
            found.append((sample.type, f"{', '.join(sample.seen)} in {sample_file}"))
        merged = _finish(reduce(merge, (kind for kind, _ in found), pa.null()))
        if isinstance(merged, _Mixed):
            stringified.append(Stringified(name, tuple(where for _, where in found)))
            merged = pa.string()
        types[name] = merged
    return KeptFields(rule, types, frozenset(s.field for s in stringified)), stringified


def parquet_field_types(options: CorpusOptions,
                        files: Iterable[str] | None = None) -> dict[str, list[tuple[pa.DataType, str]]]:
    """Each kept field's column type in every Parquet file that has it, with the file, from the footers.

    A file that is not readable Parquet is left out (reading its shard reports it).
    """
    if files is None:
        root, listed = list_sources(options)
        paths = [source.path for source in listed]
    else:
        root, paths = resolve_root(options), list(dict.fromkeys(files))
    found: dict[str, list[tuple[pa.DataType, str]]] = {name: [] for name in options.keep_fields}
    for path in paths:
        if detect_format(path, options.format).name != "parquet":
            continue
        try:
            schema = parquet_schema(root.fs, root.url(path), path)
        except CorpusMismatch:
            continue  # not Parquet at all: its own shard reports it (see readers.py)
        for name in options.keep_fields:
            kind = schema_type(schema, name)
            if kind is not None:
                found[name].append((kind, path))
    return found


def keep_field_types(options: CorpusOptions, files: Iterable[str] | None = None) -> dict[str, pa.DataType]:
    """The kept fields' types under ``stringify``: a Parquet field has its column's type, any other is string.

    ``files`` are source paths relative to the corpus root (``Shard.sources``); ``None`` lists the
    corpus. Parquet files that disagree on a type raise ``CorpusError``.
    """
    return _stringify_types(parquet_field_types(options, files))


def _stringify_types(columns: Mapping[str, list[tuple[pa.DataType, str]]]) -> dict[str, pa.DataType]:
    types: dict[str, pa.DataType] = {}
    for name, found in columns.items():
        types[name] = found[0][0] if found else pa.string()
        for kind, path in found[1:]:
            if kind != types[name]:
                raise CorpusError(f"keep field {name!r} is {found[0][0]} in {found[0][1]} but {kind} in {path}; "
                                  "the output needs one type per field")
    return types


def sample_fields(values: Mapping[str, list[Any]]) -> dict[str, FieldSample]:
    """What sampled values say of each field (``values``: the field's values, ``None`` where absent)."""
    samples = {}
    for name, found in values.items():
        kinds = [type_of(value) for value in found if value is not None]
        seen = tuple(dict.fromkeys("an integer beyond int64" if isinstance(k, _Mixed) else type_name(k)
                                   for k in kinds))
        samples[name] = FieldSample(reduce(merge, kinds, pa.null()), seen)
    return samples


def type_of(value: Any) -> Inferred:
    """The Arrow type a JSON value takes: ``null`` for null, ``MIXED`` where its parts disagree."""
    if value is None:
        return pa.null()
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64() if _INT64[0] <= value <= _INT64[1] else MIXED
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, list):
        return _list_of(reduce(merge, (type_of(item) for item in value), pa.null()))
    if isinstance(value, dict):
        return _struct_of([(str(key), type_of(item)) for key, item in value.items()])
    return MIXED


def merge(a: Inferred, b: Inferred) -> Inferred:
    """The type that holds values of ``a`` and of ``b`` unchanged, or ``MIXED``."""
    if isinstance(a, _Mixed) or isinstance(b, _Mixed):
        return MIXED
    if pa.types.is_null(a) or a == b:
        return b
    if pa.types.is_null(b):
        return a
    if {a, b} == {pa.int64(), pa.float64()}:
        return pa.float64()
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _list_of(merge(a.value_type, b.value_type))
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        members = {f.name: f.type for f in a}
        for f in b:
            members[f.name] = merge(members[f.name], f.type) if f.name in members else f.type
        return _struct_of(list(members.items()))
    return MIXED


def _finish(kind: Inferred) -> Inferred:
    """``kind`` made writable: nothing known is string; a struct with no member cannot be a column."""
    if isinstance(kind, _Mixed):
        return kind
    if pa.types.is_null(kind):
        return pa.string()
    if pa.types.is_list(kind):
        return _list_of(_finish(kind.value_type))
    if pa.types.is_struct(kind):
        return _struct_of([(f.name, _finish(f.type)) for f in kind]) if kind.num_fields else MIXED
    return kind


def _list_of(inner: Inferred) -> Inferred:
    """A list of ``inner``, or ``MIXED`` when ``inner`` is."""
    return MIXED if isinstance(inner, _Mixed) else pa.list_(inner)


def _struct_of(members: list[tuple[str, Inferred]]) -> Inferred:
    """A struct of ``members``, or ``MIXED`` when any of them is."""
    if any(isinstance(kind, _Mixed) for _, kind in members):
        return MIXED
    return pa.struct(members)  # type: ignore[arg-type]


def unfit(value: Any, kind: pa.DataType) -> str | None:
    """``None`` when ``value`` is written as ``kind`` unchanged; else what the value is, for a message."""
    if value is None:
        return None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        fits = isinstance(value, str)
    elif pa.types.is_boolean(kind):
        fits = isinstance(value, bool)
    elif pa.types.is_int64(kind):
        fits = isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value <= _INT64[1]
    elif pa.types.is_float64(kind):
        fits = isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)
                                            and float(value) == value)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not isinstance(value, list):
            return describe(value)
        for index, item in enumerate(value):
            if (inner := unfit(item, kind.value_type)) is not None:
                return f"a list whose item {index} is {inner}"
        return None
    elif pa.types.is_struct(kind):
        if not isinstance(value, dict):
            return describe(value)
        members = {f.name: f.type for f in kind}
        for key, item in value.items():
            if key not in members:
                return f"an object with a key {key!r} that the column has not"
            if (inner := unfit(item, members[key])) is not None:
                return f"an object whose {key!r} is {inner}"
        return None
    else:  # a Parquet column's own type (a timestamp, int32, …): only what pyarrow gives back unchanged
        try:
            back = pa.array([value], kind).to_pylist()[0]
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return describe(value)
        fits = type(back) is type(value) and back == value
    return None if fits else describe(value)


def stringify(value: Any) -> str | None:
    """``value`` as a stringified field holds it: strings as they are, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def describe(value: Any) -> str:
    """What a value is, in words: ``a string ('abc')``, ``an integer (5)``, ``a list``."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, str):
        return f"a string ({shown})"
    if isinstance(value, int):
        return f"an integer ({shown})"
    if isinstance(value, float):
        return f"a float ({shown})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__} ({shown})"


def type_name(kind: pa.DataType) -> str:
    """An Arrow type as the docs write it: ``float64`` (Arrow: ``double``), ``list<int64>``, ``struct<x: int64>``."""
    if pa.types.is_float64(kind):
        return "float64"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{type_name(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{f.name}: {type_name(f.type)}' for f in kind)}>"
    return str(kind)
