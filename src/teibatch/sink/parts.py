"""Parquet parts: per shard one vectors part, one rejects part and, with ``chunking.document_vector``,
one documents part, each with a fixed schema."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from teibatch.errors import StorageFull
from teibatch.quantize import Quantization
from teibatch.sink.store import OutputStore
from teibatch.sparse import SparseVector, join_rows, split_rows
from teibatch.storage_errors import storage_full

VECTORS_DIR = "vectors"
REJECTS_DIR = "rejects"
DOCUMENTS_DIR = "documents"
METADATA_KEY = b"teibatch"

REJECTS_SCHEMA = pa.schema([("id", pa.string()), ("reason", pa.string()), ("detail", pa.string())])
# Columns whose values are (nearly) all different: a dictionary only costs time there (it is tried,
# then abandoned once it outgrows its page), and vector coordinates' min/max statistics help no reader.
FIXED_COLUMNS = ("id", "embedding", "content_hash", "truncated")  # then the kept fields, in the job's order
# With output.keep_float, right after ``embedding``: the float32 vector the stored one was quantized from.
FLOAT_COLUMN = "embedding_float"
SPARSE_COLUMNS = ("indices", "values")  # sparse vectors: in place of ``embedding``
# With chunking, after the fixed columns: where each chunk lies in its document (then ``text`` with
# chunking.store_text), before the kept fields.
CHUNK_COLUMNS = (("doc_id", pa.string()), ("chunk_index", pa.int32()), ("chunk_count", pa.int32()),
                 ("char_start", pa.int64()), ("char_end", pa.int64()))
CHUNK_TEXT_COLUMN = "text"
UNIQUE_COLUMNS = frozenset({"id", "embedding", FLOAT_COLUMN, "content_hash", *SPARSE_COLUMNS})
NO_STATISTICS = frozenset({"embedding", FLOAT_COLUMN, *SPARSE_COLUMNS})
VALUE_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "int8": pa.int8(), "uint8": pa.uint8(),
               "binary": pa.uint8()}
SPILL_COPY_BYTES = 8 << 20


@dataclass(frozen=True)
class VectorSchema:
    """The vectors part schema: ``id``, ``embedding`` (and ``embedding_float`` with ``keep_float``),
    ``content_hash``, ``truncated``, the chunk columns when ``chunks`` (:data:`CHUNK_COLUMNS`, and ``text``
    when ``chunk_text``), the kept fields.

    ``quantization``: how ``embedding`` is stored; an ``int8``/``uint8`` one holds the output's
    calibration. Without it, ``vector_type`` must not need one.

    With ``sparse``, ``indices`` (``list<int32>``, ascending) and ``values`` (``list<float32>``) stand
    in place of ``embedding``, and ``dimension`` is the vocabulary size (metadata key ``vocab_size``).
    """

    dimension: int
    vector_type: str = "float32"
    quantization: Quantization | None = None
    keep_float: bool = False
    kept: Mapping[str, pa.DataType] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    chunks: bool = False
    chunk_text: bool = False
    sparse: bool = False

    @property
    def value_type(self) -> pa.DataType:
        return VALUE_TYPES[self.vector_type]

    @property
    def rule(self) -> Quantization:
        """How this schema's float vectors become ``embedding`` values."""
        return self.quantization if self.quantization is not None else Quantization(self.vector_type)

    @property
    def chunk_columns(self) -> list[tuple[str, pa.DataType]]:
        """The chunk columns of this schema, in order (none without chunking)."""
        if not self.chunks:
            return []
        return [*CHUNK_COLUMNS, *([(CHUNK_TEXT_COLUMN, pa.string())] if self.chunk_text else [])]

    def _embedding(self) -> list[pa.Field]:
        """``embedding`` and, with ``keep_float``, ``embedding_float``."""
        width = self.rule.width(self.dimension)
        fields = [pa.field("embedding", pa.list_(pa.field("item", self.value_type, nullable=False), width),
                           nullable=False)]
        if self.keep_float:
            fields.append(pa.field(FLOAT_COLUMN, pa.list_(pa.field("item", pa.float32(), nullable=False),
                                                          self.dimension), nullable=False))
        return fields

    def _vector_fields(self) -> list[pa.Field]:
        if not self.sparse:
            return self._embedding()
        return [pa.field(name, pa.list_(pa.field("item", dtype, nullable=False)), nullable=False)
                for name, dtype in zip(SPARSE_COLUMNS, (pa.int32(), pa.float32()), strict=True)]

    def _metadata(self) -> dict[bytes, bytes]:
        if self.sparse:
            return {METADATA_KEY: orjson.dumps({**self.metadata, "kind": "sparse", "vocab_size": self.dimension,
                                                "vector_type": "float32"})}
        rule = self.rule
        quantized = {"quantization": rule.to_json()} if rule.vector_type not in ("float32", "float16") else {}
        return {METADATA_KEY: orjson.dumps({**self.metadata, "dimension": self.dimension,
                                            "vector_type": self.vector_type, **quantized,
                                            **({"keep_float": True} if self.keep_float else {})})}

    def arrow(self) -> pa.Schema:
        return self._schema(self._vector_fields(), [("truncated", pa.bool_()), *self.chunk_columns])

    def documents_arrow(self) -> pa.Schema:
        """The documents part's schema (``chunking.document_vector``): ``id`` (the document's),
        ``embedding``, ``content_hash``, ``chunk_count``, the kept fields."""
        return self._schema(self._embedding(), [("chunk_count", pa.int32())])

    def _schema(self, vector_fields: list[pa.Field], after_hash: list[tuple[str, pa.DataType]]) -> pa.Schema:
        """``id``, ``vector_fields``, ``content_hash``, the ``after_hash`` columns, the kept fields (nullable)."""
        fields = [pa.field("id", pa.string(), nullable=False), *vector_fields,
                  pa.field("content_hash", pa.string(), nullable=False)]
        fields += [pa.field(name, dtype, nullable=False) for name, dtype in after_hash]
        fields += [pa.field(name, dtype) for name, dtype in self.kept.items()]
        return pa.schema(fields, metadata=self._metadata())


@dataclass(frozen=True)
class WriteOptions:
    compression: str = "zstd"
    row_group_size: int = 8192


STAGED_MARK = ".staged-"
"""A part written under ``.staged-part-<shard>`` waits, hidden, for the parts it replaces to go (``sink/replace.py``):
readers skip it (pyarrow and pandas skip names starting with ``.``, and it matches no ``*.parquet`` glob)."""


def part_name(shard_id: str, *, staged: bool = False) -> str:
    """A part's file name; ``staged``: its hidden name while it waits to replace older parts."""
    return f"{STAGED_MARK}part-{shard_id}" if staged else f"part-{shard_id}.parquet"


def part_path(directory: str, shard_id: str, *, staged: bool = False) -> str:
    """Where shard ``shard_id``'s part of ``directory`` (vectors, rejects) lives, relative to the output."""
    return f"{directory}/{part_name(shard_id, staged=staged)}"


def vectors_table(schema: VectorSchema, ids: Sequence[str], vectors: np.ndarray, hashes: Sequence[str],
                  kept: Mapping[str, Sequence[Any]], truncated: Sequence[bool] | np.ndarray | None = None,
                  chunks: Mapping[str, Sequence[Any] | np.ndarray] | None = None) -> pa.Table:
    """A vectors table in ``schema``; ``vectors`` is (rows, dimension) float32, stored by ``schema.rule``,
    or with ``schema.sparse`` one :class:`~teibatch.sparse.SparseVector` per row.

    ``truncated`` marks texts the client cut or had the server truncate after a refusal
    (``model.on_too_long: truncate``); absent, no row is marked. ``chunks``: the chunk columns'
    values by name, when ``schema.chunks``.
    """
    flags = np.zeros(len(ids), dtype=bool) if truncated is None else np.asarray(truncated, dtype=bool)
    vector_columns = _sparse_arrays(vectors) if schema.sparse else _embedding_arrays(schema, vectors)
    columns: list[pa.Array] = [_string_array(ids), *vector_columns, _string_array(hashes), _bool_array(flags)]
    for name, dtype in schema.chunk_columns:
        values = (chunks or {})[name]
        columns.append(_string_array(values) if dtype == pa.string()  # type: ignore[arg-type]
                       else _int_array(dtype, values))
    columns += [pa.array(kept.get(name, [None] * len(ids)), dtype) for name, dtype in schema.kept.items()]
    return pa.Table.from_arrays(columns, schema=schema.arrow())


def documents_table(schema: VectorSchema, ids: Sequence[str], vectors: np.ndarray, hashes: Sequence[str],
                    chunk_counts: Sequence[int], kept: Mapping[str, Sequence[Any]]) -> pa.Table:
    """A documents part table (:meth:`VectorSchema.documents_arrow`); ``vectors`` is (rows, dimension)."""
    columns: list[pa.Array] = [_string_array(ids), *_embedding_arrays(schema, vectors), _string_array(hashes),
                               _int_array(pa.int32(), chunk_counts)]
    columns += [pa.array(kept.get(name, [None] * len(ids)), dtype) for name, dtype in schema.kept.items()]
    return pa.Table.from_arrays(columns, schema=schema.documents_arrow())


def _embedding_arrays(schema: VectorSchema, vectors: np.ndarray) -> list[pa.Array]:
    """The ``embedding`` column of float ``vectors`` (and ``embedding_float`` with ``keep_float``)."""
    floats = np.asarray(vectors, dtype=np.float32)
    stored = [_fixed_list(schema.value_type, schema.rule.quantize(floats), schema.rule.width(schema.dimension))]
    if schema.keep_float:
        stored.append(_fixed_list(pa.float32(), floats, schema.dimension))
    return stored


def _fixed_list(value_type: pa.DataType, rows: np.ndarray, width: int) -> pa.Array:
    """``rows`` (rows, width) as a ``fixed_size_list<value_type>[width]`` array, built from its buffer."""
    values = np.ascontiguousarray(rows)
    return pa.FixedSizeListArray.from_arrays(
        pa.Array.from_buffers(value_type, values.size, [None, pa.py_buffer(values.reshape(-1))]), width)


def _sparse_arrays(vectors: np.ndarray) -> list[pa.Array]:
    """``indices`` and ``values`` list arrays of sparse rows, built from their buffers (one copy of each)."""
    offsets, indices, values = join_rows(vectors)
    offsets_buffer = pa.py_buffer(offsets.astype(np.int32))
    return [pa.ListArray.from_buffers(pa.list_(pa.field("item", dtype, nullable=False)), len(vectors),
                                      [None, offsets_buffer],
                                      children=[pa.Array.from_buffers(dtype, len(flat), [None, pa.py_buffer(flat)])])
            for dtype, flat in ((pa.int32(), indices), (pa.float32(), values))]


def rejects_table(ids: Sequence[str], reasons: Sequence[str], details: Sequence[str]) -> pa.Table:
    return pa.Table.from_arrays([_string_array(ids), _string_array(reasons), _string_array(details)],
                                schema=REJECTS_SCHEMA)


# Parts' fixed columns are built from their buffers rather than with ``pa.array``, which imports
# pandas on a process's first call wherever pandas is installed (Ray's extras install it): CPU in
# every shard worker, spent at the end of its first shard while the servers wait (docs/client.md).
def _string_array(values: Sequence[str]) -> pa.Array:
    """``values`` (no ``None``) as an Arrow ``string`` array."""
    encoded = [value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:  # past string's 32-bit offsets: let pyarrow split it
        return pa.array(values, pa.string())
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))])


def _int_array(dtype: pa.DataType, values: Sequence[int] | np.ndarray) -> pa.Array:
    """``values`` as an Arrow ``int32`` or ``int64`` array (no nulls)."""
    array = np.ascontiguousarray(values, dtype=np.int32 if dtype == pa.int32() else np.int64)
    return pa.Array.from_buffers(dtype, len(array), [None, pa.py_buffer(array)])


def _bool_array(flags: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(flags), [None, pa.py_buffer(np.packbits(flags, bitorder="little"))])


def write_part(store: OutputStore, directory: str, shard_id: str, table: pa.Table,
               options: WriteOptions, *, staged: bool = False) -> str:
    """Write ``table`` as ``<directory>/part-<shard>.parquet`` (``staged``: under its hidden staged name),
    all or nothing; return its relative path."""
    relative = part_path(directory, shard_id, staged=staged)
    store.write_atomic(relative, lambda handle: write_part_to(handle, table, options))
    return relative


def write_part_to(handle: Any, table: pa.Table, options: WriteOptions) -> None:
    """``table`` as one Parquet file into the open binary ``handle``, encoded as every part is."""
    pq.write_table(table, handle, row_group_size=options.row_group_size, **_parquet_options(table.schema, options))


def _parquet_options(schema: pa.Schema, options: WriteOptions) -> dict[str, Any]:
    """``pq.ParquetWriter``'s encoding options for a part of ``schema``."""
    names = schema.names
    # An 8-bit embedding (int8, uint8, binary) has at most 256 values: a dictionary stores each in about
    # a byte, where Parquet's plain encoding would spend four (it has no 8-bit type) — 359 bytes for a
    # 384-dimension int8 vector instead of 530, after zstd.
    # (A list's values are named by their Parquet path.)
    small = [f"{n}.list.element" for n in names if n == "embedding" and schema.field(n).type.value_type.bit_width == 8]
    return {"compression": None if options.compression == "none" else options.compression,
            "use_dictionary": [n for n in names if n not in UNIQUE_COLUMNS] + small,
            "write_statistics": [n for n in names if n not in NO_STATISTICS]}


class VectorsPart:
    """A vectors part encoded as its rows become final, then written all or nothing by :meth:`commit`.

    A shard's vectors come back over minutes; encoding each row group as soon as its rows are in
    (into a local spill file) leaves only the last, partial group for after the shard's last vector,
    when at the end of a run the servers wait for it (docs/output.md has the cost of compressing a part).
    Rows must be added in the part's order. Nothing reaches the output before :meth:`commit`, so a
    task killed half-way leaves nothing behind (the spill file is unlinked from the start), not even
    an open multipart upload. Use it as a context manager: leaving it discards what was not committed.
    """

    def __init__(self, schema: VectorSchema, options: WriteOptions) -> None:
        self._arrow = schema.arrow()
        self._group = max(1, options.row_group_size)
        with _spilling():
            self._spill = tempfile.TemporaryFile(prefix="teibatch-part-")  # noqa: SIM115 (closed by close())
            self._writer = pq.ParquetWriter(self._spill, self._arrow, **_parquet_options(self._arrow, options))
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0
        self.bytes = 0  # the part's size once committed (the manifest records it, to find a part gone or cut)

    def add(self, table: pa.Table) -> None:
        """Append ``table``'s rows (a :func:`vectors_table` of this part's schema); encode every full group."""
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= self._group:
            pending = pa.concat_tables(self._pending)
            full = self._pending_rows - self._pending_rows % self._group
            with _spilling():
                self._writer.write_table(pending.slice(0, full), row_group_size=self._group)
            self._pending = [pending.slice(full)]
            self._pending_rows -= full

    @property
    def encoded_rows(self) -> int:
        """Rows already encoded into row groups (the rest wait for their group to fill, or for the commit)."""
        return self.rows - self._pending_rows

    def commit(self, store: OutputStore, directory: str, shard_id: str, *, staged: bool = False) -> str:
        """Encode the rest, write the part as ``<directory>/part-<shard>.parquet`` (``staged``: under its hidden
        staged name); return its relative path."""
        with _spilling():
            if self._pending_rows or not self.rows:  # an empty part still gets its (empty) row group
                rest = pa.concat_tables(self._pending) if self._pending else self._arrow.empty_table()
                self._writer.write_table(rest, row_group_size=self._group)
            self._pending, self._pending_rows = [], 0
            self._writer.close()
        self.bytes = self._spill.seek(0, 2)
        self._spill.seek(0)
        relative = part_path(directory, shard_id, staged=staged)
        store.write_atomic(relative, lambda handle: shutil.copyfileobj(self._spill, handle, SPILL_COPY_BYTES))
        return relative

    def close(self) -> None:
        """Forget the part (a no-op after :meth:`commit`'s write): its spill file goes away."""
        with contextlib.suppress(Exception):  # closing twice is harmless; a failed write may leave it broken
            self._writer.close()
        self._spill.close()

    def __enter__(self) -> VectorsPart:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def _spilling() -> Iterator[None]:
    """Encoding into a spill file: no room left in the temporary directory is :class:`StorageFull` naming it."""
    try:
        yield
    except OSError as exc:
        if not storage_full(exc):
            raise
        directory = tempfile.gettempdir()
        raise StorageFull(f"no room left to encode a part in {directory}: {exc}", path=directory,
                          temporary=True) from exc


def warm_up() -> None:
    """Do pyarrow's one-time work of a first ``pa.array`` now (call it in a background thread).

    Only a part with kept fields, or reading an earlier run's parts, calls ``pa.array`` (see
    :func:`_string_array`), and pyarrow imports pandas, when installed, on the first call of a process;
    a shard task that will need it does that while its texts are being embedded.
    """
    pa.array(["warm"], pa.string())


def read_vectors(store: OutputStore, parts: Sequence[str], ids: set[str], schema: VectorSchema,
                 by: str = "id") -> dict[str, tuple[str, np.ndarray | SparseVector, bool]]:
    """``id → (content_hash, vector, truncated)`` for the rows of ``parts`` whose id is in ``ids``;
    float32 vectors, or with ``schema.sparse`` each a :class:`~teibatch.sparse.SparseVector`. With
    ``by="content_hash"``, ``content_hash → …`` for the rows whose hash is in ``ids``.

    ``schema``: the output's, whose :attr:`~VectorSchema.rule` the parts were written with. A quantized
    part gives its ``embedding_float`` column when it has one, else each stored vector's
    :meth:`~Quantization.dequantize`, and only where that quantizes back to the very same stored
    values: a row that would not is left out, and embedded again. Parts that have disappeared are
    skipped too: reuse is an optimisation, never a requirement.
    """
    rule, sparse = schema.rule, schema.sparse
    found: dict[str, tuple[str, np.ndarray | SparseVector, bool]] = {}
    for relative in parts:
        try:
            with store.fs.open(store.path(relative), "rb") as handle:
                parquet = pq.ParquetFile(handle)
                floats = FLOAT_COLUMN in parquet.schema_arrow.names
                vector_columns = (list(SPARSE_COLUMNS) if sparse else [FLOAT_COLUMN if floats else "embedding"])
                table = parquet.read(columns=["id", "content_hash", *vector_columns, "truncated"])
        except FileNotFoundError:
            continue
        part_ids = table.column(by).to_pylist()
        wanted = [i for i, doc_id in enumerate(part_ids) if doc_id in ids]
        if not wanted:
            continue
        table = table.take(wanted)
        vectors: Any
        if sparse:
            indices, values = (table.column(name).combine_chunks() for name in SPARSE_COLUMNS)
            vectors = split_rows(indices.offsets.to_numpy() - indices.offsets[0].as_py(),
                                 indices.flatten().to_numpy(), values.flatten().to_numpy())
            exact = np.ones(len(table), dtype=bool)
        else:
            embedding = table.column(FLOAT_COLUMN if floats else "embedding").combine_chunks()
            stored = embedding.values.to_numpy(zero_copy_only=False).reshape(len(embedding), -1)
            if floats:
                vectors, exact = stored.astype(np.float32), np.ones(len(stored), dtype=bool)
            else:
                vectors = rule.dequantize(stored, schema.dimension)
                exact = (rule.quantize(vectors) == stored).all(axis=1)
        hashes = table.column("content_hash").to_pylist()
        flags = table.column("truncated").to_pylist()
        for row, key in enumerate(table.column(by).to_pylist()):
            if exact[row]:
                found[key] = (hashes[row], vectors[row], flags[row])
    return found


def part_metadata(store: OutputStore, relative: str) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """A vectors part's ``teibatch`` schema metadata and its kept fields' names, or ``None`` when the
    part is gone or is not one of teibatch's (what an output's parts say they were made with)."""
    try:
        with store.fs.open(store.path(relative), "rb") as handle:
            schema = pq.read_schema(handle)
        metadata = orjson.loads((schema.metadata or {})[METADATA_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    sparse_extra = len(SPARSE_COLUMNS) - 1 if metadata.get("kind") == "sparse" else 0
    rest = schema.names[len(FIXED_COLUMNS) + sparse_extra + bool(metadata.get("keep_float")):]
    if "chunking" in metadata:  # the chunk columns come before the kept fields
        rest = rest[len(CHUNK_COLUMNS) + bool(metadata["chunking"].get("store_text")):]
    return metadata, tuple(rest)


def shard_of(name: str) -> str | None:
    """The shard id in a part file name, or ``None`` for other files (staged names too: :func:`staged_shard_of`)."""
    if name.startswith("part-") and name.endswith(".parquet"):
        return name[len("part-"):-len(".parquet")]
    return None


def staged_shard_of(name: str) -> str | None:
    """The shard id in a staged part's file name, or ``None`` for other files."""
    prefix = f"{STAGED_MARK}part-"
    return name[len(prefix):] if name.startswith(prefix) else None
