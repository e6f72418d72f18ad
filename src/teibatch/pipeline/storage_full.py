"""When the run's storage is full: how much more room it needs, and the error that says so.

A full disk or a quota refuses every write the same way until room is made, so running the same
command again as it is cannot help. A run that meets one starts no more shards and ends with
:class:`StorageFull` (exit code 1: what is committed stays, and once there is room the same
command resumes), naming the full place and the bytes still needed. That is an estimate: the
committed parts' mean bytes per document times the documents still to write or, before any part
is committed, the vectors alone (dimension × bytes per value).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from teibatch.corpus import Shard
from teibatch.errors import SinkError, StorageFull
from teibatch.job import JobSpec
from teibatch.pipeline.summary import RunSummary
from teibatch.sink import REJECTS_DIR, VECTORS_DIR, Manifest, OutputStore, remove_uncommitted_temp
from teibatch.sink.parts import part_name
from teibatch.storage_errors import STORAGE_ERRORS

BYTES_PER_VALUE = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "binary": 0.125}


@dataclass(frozen=True)
class Estimate:
    """Bytes for ``documents`` more documents at ``per_document`` bytes each, and what that rate comes from."""

    documents: int
    per_document: float
    basis: str

    @property
    def needed_bytes(self) -> int:
        return round(self.documents * self.per_document)

    def describe(self, more: str = "") -> str:
        return (f"about {size(self.needed_bytes)}{more} (an estimate: {self.documents:,} documents × "
                f"{size(self.per_document)} per document, {self.basis})")


def documents_left(shards: Sequence[Shard], manifest: Manifest) -> int:
    """Documents of the planned ``shards`` that no committed shard holds yet."""
    return sum(shard.size for shard in shards if shard.id not in manifest.shards)


def with_estimate(error: StorageFull, job: JobSpec, store: OutputStore, manifest: Manifest | None,
                  shards: Sequence[Shard] | None) -> StorageFull:
    """``error`` as the run ends with it: the full place, the room still needed, and what to do.

    ``shards``: the corpus as planned, ``None`` before it is (then the latest plan's pending shards,
    at the committed shards' mean size, stand in for the documents still to write).
    """
    manifest = manifest or _stored_manifest(store)
    documents = documents_left(shards, manifest) if shards and manifest is not None else None
    if documents is None and manifest is not None and manifest.shards:
        committed = [e.rows + e.rejects for e in manifest.shards.values()]
        documents = round(len(manifest.pending) * sum(committed) / len(committed))
    rate = _bytes_per_document(store, manifest, job.output.vector_type)
    resume = "then run the same command again: it resumes"
    if error.temporary:
        estimate = None if rate is None else Estimate(job.corpus.shard_docs, *rate)
        room = f": each running shard encodes its part there, {estimate.describe()}" if estimate is not None else ""
        message = (f"the shard tasks' temporary directory {error.path} is full{room}. Make room there, or point "
                   f"TMPDIR at a larger disk for the run (Ray's workers inherit it), {resume}. What failed: {error}")
    else:
        estimate = None if rate is None or documents is None else Estimate(documents, *rate)
        needs = (f"needs {estimate.describe(' more')}" if estimate is not None else
                 "needs more room; how much cannot be estimated before the servers are met or a part is committed")
        committed_shards = len(manifest.shards) if manifest is not None else 0
        message = (f"the output's storage is full: {store.url} {needs}. Its {committed_shards} committed shard(s) stay "
                   f"committed; make that much room there (or raise its quota), {resume}. What failed: {error}")
    return StorageFull(message, path=error.path, temporary=error.temporary,
                       needed_bytes=estimate.needed_bytes if estimate is not None else None)


def end_storage_full(job: JobSpec, store: OutputStore, manifest: Manifest, shards: Sequence[Shard],
                      summary: RunSummary) -> None:
    """The run met a full storage: it is incomplete, and its error and report say how much room it needs.

    What killed shard tasks left half-written is removed, to make room for the manifest and the report.
    """
    assert summary.storage_full is not None
    summary.status = "incomplete"
    with contextlib.suppress(*STORAGE_ERRORS):
        remove_uncommitted_temp(store)
    full = summary.storage_full = with_estimate(summary.storage_full, job, store, manifest, shards)
    summary.errors.insert(0, str(full))
    with contextlib.suppress(StorageFull):
        manifest.save(store)  # it may have failed before the room was made


def report_refused(store: OutputStore, report: dict[str, Any], exc: StorageFull) -> StorageFull:
    """A run's report that found no room: the run is over, but nothing would say how it went."""
    needed = len(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return StorageFull(f"the output's storage is full: {store.url} needs about {size(needed)} more for this run's "
                       f"report; every shard this run got to is committed. Make room there, then run the same "
                       f"command again (it writes a report). What failed: {exc}", path=store.url, needed_bytes=needed)


def _bytes_per_document(store: OutputStore, manifest: Manifest | None,
                        vector_type: str) -> tuple[float, str] | None:
    """Bytes a document takes in the output, and on what that rests; ``None`` when nothing says."""
    if manifest is None:
        return None
    with contextlib.suppress(*STORAGE_ERRORS):
        vectors, rejects = store.sizes(VECTORS_DIR), store.sizes(REJECTS_DIR)
        measured = [(entry, vectors[part_name(sid)] + rejects.get(part_name(sid), 0))
                    for sid, entry in manifest.shards.items() if part_name(sid) in vectors]
        documents = sum(entry.rows + entry.rejects for entry, _ in measured)
        if documents:
            return (sum(size for _, size in measured) / documents,
                    f"the mean of the {len(measured)} committed part(s)")
    dimension = manifest.info.get("dimension")
    if isinstance(dimension, int):
        value = BYTES_PER_VALUE.get(vector_type, 4)
        return dimension * value, f"the vectors alone: {dimension} dimensions × {value} bytes"
    return None


def _stored_manifest(store: OutputStore) -> Manifest | None:
    try:
        return Manifest.load(store)
    except SinkError:  # unreadable: the estimate goes without it
        return None


def size(count: float) -> str:
    """``count`` bytes for a reader: ``812 bytes``, ``1.5 kB``, ``12.4 MB``, ``3.1 GB`` (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{round(count)} bytes"
