"""Parquet parts: one vectors part and one rejects part per shard, with a fixed schema."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from teibatch.sink.store import OutputStore

VECTORS_DIR = "vectors"
REJECTS_DIR = "rejects"
METADATA_KEY = b"teibatch"

REJECTS_SCHEMA = pa.schema([("id", pa.string()), ("reason", pa.string()), ("detail", pa.string())])
# Columns whose values are (nearly) all different: a dictionary only costs time there (it is tried,
# then abandoned once it outgrows its page), and vector coordinates' min/max statistics help no reader.
UNIQUE_COLUMNS = frozenset({"id", "embedding", "content_hash"})
NO_STATISTICS = frozenset({"embedding"})


@dataclass(frozen=True)
class VectorSchema:
    """The vectors part schema: ``id``, ``embedding``, ``content_hash`` and the kept fields."""

    dimension: int
    vector_type: str = "float32"
    kept: Mapping[str, pa.DataType] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def value_type(self) -> pa.DataType:
        return pa.float16() if self.vector_type == "float16" else pa.float32()

    def arrow(self) -> pa.Schema:
        fields = [pa.field("id", pa.string(), nullable=False),
                  pa.field("embedding", pa.list_(pa.field("item", self.value_type, nullable=False),
                                                 self.dimension), nullable=False),
                  pa.field("content_hash", pa.string(), nullable=False),
                  pa.field("truncated", pa.bool_(), nullable=False)]
        fields += [pa.field(name, dtype) for name, dtype in self.kept.items()]
        meta = {METADATA_KEY: orjson.dumps({**self.metadata, "dimension": self.dimension,
                                            "vector_type": self.vector_type})}
        return pa.schema(fields, metadata=meta)


@dataclass(frozen=True)
class WriteOptions:
    compression: str = "zstd"
    row_group_size: int = 8192


def part_name(shard_id: str) -> str:
    return f"part-{shard_id}.parquet"


def vectors_table(schema: VectorSchema, ids: Sequence[str], vectors: np.ndarray, hashes: Sequence[str],
                  kept: Mapping[str, Sequence[Any]], truncated: Sequence[bool] | np.ndarray | None = None) -> pa.Table:
    """A vectors table in ``schema``; ``vectors`` is (rows, dimension) float32.

    ``truncated`` marks texts the client cut or had the server truncate after a refusal
    (``model.on_too_long: truncate``); absent, no row is marked.
    """
    arrow = schema.arrow()
    values = np.ascontiguousarray(vectors, dtype=np.float16 if schema.vector_type == "float16" else np.float32)
    embedding = pa.FixedSizeListArray.from_arrays(
        pa.Array.from_buffers(schema.value_type, values.size, [None, pa.py_buffer(values.reshape(-1))]),
        schema.dimension)
    flags = np.zeros(len(ids), dtype=bool) if truncated is None else np.asarray(truncated, dtype=bool)
    columns: list[pa.Array] = [_string_array(ids), embedding, _string_array(hashes), _bool_array(flags)]
    columns += [pa.array(kept.get(name, [None] * len(ids)), dtype) for name, dtype in schema.kept.items()]
    return pa.Table.from_arrays(columns, schema=arrow)


def rejects_table(ids: Sequence[str], reasons: Sequence[str], details: Sequence[str]) -> pa.Table:
    return pa.Table.from_arrays([_string_array(ids), _string_array(reasons), _string_array(details)],
                                schema=REJECTS_SCHEMA)


# Parts' fixed columns are built from their buffers rather than with ``pa.array``, which imports
# pandas on a process's first call wherever pandas is installed (Ray's extras install it): 0.3-0.5 s
# of CPU in every shard worker, spent at the end of its first shard while the servers wait.
def _string_array(values: Sequence[str]) -> pa.Array:
    """``values`` (no ``None``) as an Arrow ``string`` array."""
    encoded = [value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:  # past string's 32-bit offsets: let pyarrow split it
        return pa.array(values, pa.string())
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))])


def _bool_array(flags: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), len(flags), [None, pa.py_buffer(np.packbits(flags, bitorder="little"))])


def write_part(store: OutputStore, directory: str, shard_id: str, table: pa.Table,
               options: WriteOptions) -> str:
    """Write ``table`` as ``<directory>/part-<shard>.parquet``, all or nothing; return its relative path."""
    relative = f"{directory}/{part_name(shard_id)}"
    compression = None if options.compression == "none" else options.compression
    names = table.column_names
    store.write_atomic(relative, lambda handle: pq.write_table(
        table, handle, compression=compression, row_group_size=options.row_group_size,
        use_dictionary=[n for n in names if n not in UNIQUE_COLUMNS],
        write_statistics=[n for n in names if n not in NO_STATISTICS]))
    return relative


def warm_up() -> None:
    """Do pyarrow's one-time work of a first ``pa.array`` now (call it in a background thread).

    Only a part with kept fields, or reading an earlier run's parts, calls ``pa.array`` (see
    :func:`_string_array`), and pyarrow imports pandas, when installed, on the first call of a process
    (half a second of CPU); a shard task that will need it does that while its texts are being embedded.
    """
    pa.array(["warm"], pa.string())


def read_vectors(store: OutputStore, parts: Sequence[str],
                 ids: set[str]) -> dict[str, tuple[str, np.ndarray, bool]]:
    """``id → (content_hash, vector, truncated)`` for the rows of ``parts`` whose id is in ``ids``.

    Parts that have disappeared are skipped: reuse is an optimisation, never a requirement.
    """
    found: dict[str, tuple[str, np.ndarray, bool]] = {}
    for relative in parts:
        try:
            with store.fs.open(store.path(relative), "rb") as handle:
                table = pq.read_table(handle, columns=["id", "content_hash", "embedding", "truncated"])
        except FileNotFoundError:
            continue
        part_ids = table.column("id").to_pylist()
        wanted = [i for i, doc_id in enumerate(part_ids) if doc_id in ids]
        if not wanted:
            continue
        table = table.take(wanted)
        embedding = table.column("embedding").combine_chunks()
        vectors = embedding.values.to_numpy(zero_copy_only=False).reshape(len(embedding), -1)
        hashes = table.column("content_hash").to_pylist()
        flags = table.column("truncated").to_pylist()
        for row, doc_id in enumerate(table.column("id").to_pylist()):
            found[doc_id] = (hashes[row], vectors[row].astype(np.float32), flags[row])
    return found


def shard_of(name: str) -> str | None:
    """The shard id in a part file name, or ``None`` for other files."""
    if name.startswith("part-") and name.endswith(".parquet"):
        return name[len("part-"):-len(".parquet")]
    return None
