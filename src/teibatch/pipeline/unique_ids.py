"""Every id at most once in an output, whatever the sharding: the run's id index.

Within a shard, ``read_shard`` rejects a second document with an id it has already seen. Across
shards and files the rule is the same, decided over the whole plan: the first occurrence in plan
order (the sorted file list, then the row) keeps the id, and every later one in another shard is a
``duplicate_id`` reject whose detail names both places (``b.jsonl#0 (line 1): id 'd95' (line 1) was
already seen (a.jsonl#95 (line 96))``). The decision depends only on the plan — the shard ids, which
digest the files' fingerprints and the reading options — never on which shards are committed: a
fresh run, a resumed one (after a kill, with some shards committed) and a rerun over the same corpus
decide alike, and a pending shard never writes an id that a committed shard holds.

The index is built after planning and before any server starts, in bounded memory (no set of ids
anywhere, ``sink/id_repeats.py``):

1. *spill*: Ray tasks, each over consecutive shards holding about :data:`SPILL_TASK_DOCS` documents,
   read the documents' ids (``read_ids``: no kept fields; for Parquet the id and text columns only)
   and spill ``(id, shard, position, row, line, integer)`` into hash partitions under
   ``<output>/_ids/<key>/spill/``, and, for a run with dedup and no chunking, ``(text digest, shard,
   position)`` under ``spill-texts/`` (every readable shard's: a corpus without ``id_field`` too);
2. *group*: one Ray task per partition finds the ids that more than one shard holds and writes the
   losing documents (shard, position in it, where the id is kept) to ``losers/p<k>.parquet``; and
   one per partition of texts writes the documents whose text more than one shard holds (shard,
   position) to ``shared/p<k>.parquet``;
3. ``index.json`` then lists, per shard that loses some ids, the partitions holding them, and per
   shard holding shared texts, theirs; the spill is deleted. A shard task reads its own losers
   (:meth:`IdIndex.duplicates`) and hands them to ``read_shard``; with dedup (and no chunking: then
   a document is one text), it claims in the run's registry only its shared texts
   (:meth:`IdIndex.shared_texts`, ``pipeline/dedup.py``).

Each committed shard records its decision (:meth:`IdIndex.decision`, in the manifest): a shard
committed under another one — a new file that sorts before it holds one of its ids, or the file that
held an id first is gone — runs again, so the output stays what a fresh run over the corpus writes.

Reading the ids is a second read of the corpus, so it is skipped when no two shards can share an id
(a single shard; text files, whose id is their path; rows without ``id_field``, whose id is their
place) unless the texts are indexed, and kept: ``<key>`` digests the plan (every shard id in order)
and whether texts are indexed, so a resumed run over the same corpus finds ``index.json`` and reads
nothing; a changed corpus builds a new index and the old
one is removed. Only the run holding the output's lock writes here. (In a corpus mixing text files
and row files, a row whose id equals a text file's path is not compared with it.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from teibatch.corpus import CorpusOptions, Shard
from teibatch.corpus.documents import IdSeen
from teibatch.corpus.rows import Place
from teibatch.corpus.sharding import ids_can_repeat, read_ids
from teibatch.errors import CorpusError
from teibatch.pipeline.cycles import no_cycle_collection
from teibatch.sink import OutputStore
from teibatch.sink.id_repeats import partition_count, repeated_in_partition, spill

IDS_DIR = "_ids"
INDEX_FILE = "index.json"
INDEX_VERSION = 2
SPILL_TASK_DOCS = 500_000
"""Documents one spill task reads (whole shards, in plan order)."""
SPILL_BATCH_DOCS = 100_000
"""Documents whose ids a spill task holds before it writes them (after a whole shard): its memory
stays the same whatever the corpus's size."""

_SPILL_SCHEMA = pa.schema([("id", pa.string()), ("shard", pa.int32()), ("position", pa.int32()),
                           ("row", pa.int64()), ("line", pa.int64()), ("integer", pa.bool_())])
# A document's text as the id-index partitions take it: a 64-bit digest in the ``id`` column. Two
# texts sharing one only make both claim in the registry, which compares whole content hashes; a
# string digest would take four times the memory where a partition's texts are grouped.
_TEXT_SCHEMA = pa.schema([("id", pa.int64()), ("shard", pa.int32()), ("position", pa.int32())])


@dataclass(frozen=True)
class IdIndex:
    """The run's cross-shard duplicate ids, as shard tasks consult it: ``losers`` maps the id of each
    shard that holds some to its place in the plan, the partitions listing them, and its decision."""

    output: str
    folder: str  # relative to the output
    losers: dict[str, tuple[int, tuple[int, ...], str]]
    output_options: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """Per shard holding a text that another shard holds too: its place in the plan, and the
    partitions listing those documents (``shared/p<k>.parquet``)."""
    texts: bool = False
    """Whether the texts of every readable shard were indexed (``shared``): a run with dedup and
    no chunking asks for them."""

    @property
    def losing_documents(self) -> int:
        """Documents of the plan whose id an earlier shard holds (each shard's decision starts with its count)."""
        return sum(int(decision.split(":", 1)[0]) for _, _, decision in self.losers.values())

    def decision(self, shard_id: str) -> str:
        """Which of the shard's documents lose their id, as a short digest (``""``: none). The manifest
        records it with the committed shard: a shard committed under another decision (the corpus
        gained, or lost, an earlier holder of one of its ids) is run again."""
        entry = self.losers.get(shard_id)
        return entry[2] if entry is not None else ""

    def shared_texts(self, shard_id: str) -> set[int]:
        """The positions in the shard of its documents whose text another shard of the index holds too
        (the only ones worth a claim in the run's dedup registry, ``pipeline/dedup.py``)."""
        entry = self.shared.get(shard_id)
        if entry is None:
            return set()
        index, partitions = entry
        found: set[int] = set()
        for table in self._tables("shared", partitions):
            found.update(table.filter(pc.equal(table["shard"], index)).column("position").to_pylist())
        return found

    def _tables(self, kind: str, partitions: Sequence[int]) -> Iterator[pa.Table]:
        store = OutputStore(self.output, self.output_options)
        for k in partitions:
            with store.fs.open(store.path(f"{self.folder}/{kind}/p{k}.parquet"), "rb") as handle:
                yield pq.read_table(handle)

    def duplicates(self, shard_id: str) -> dict[int, IdSeen] | None:
        """The shard's documents that lose their id, by position in the shard, with where it is kept."""
        entry = self.losers.get(shard_id)
        if entry is None:
            return None
        index, partitions, _ = entry
        found: dict[int, IdSeen] = {}
        for table in self._tables("losers", partitions):
            for row in table.filter(pc.equal(table["shard"], index)).to_pylist():
                found[row["position"]] = IdSeen(Place(row["kept_path"], row["kept_row"], row["kept_line"]),
                                                row["kept_integer"])
        return found


def index_key(shards: Sequence[Shard], texts: bool) -> str:
    """The digest of a plan (its shard ids in order: each digests its files and the reading options)
    and of what is indexed (the texts too, or ids only)."""
    blob = orjson.dumps([INDEX_VERSION, [shard.id for shard in shards], texts])
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def needs_id_index(options: CorpusOptions, shards: Sequence[Shard], texts: bool) -> bool:
    """Whether two shards of the plan can hold one id, or (``texts``) one text: else there is no index to build."""
    if texts and sum(1 for shard in shards if shard.bad_file is None) > 1:
        return True
    return sum(1 for shard in shards if ids_can_repeat(options, shard)) > 1


def stored_id_index(store: OutputStore, output_options: dict[str, Any], shards: Sequence[Shard],
                    texts: bool) -> IdIndex | None:
    """The index of the plan ``shards`` (with ``texts`` or without) when the output holds it whole
    (an earlier run built it), else ``None``."""
    folder = f"{IDS_DIR}/{index_key(shards, texts)}"
    saved = store.read_json(f"{folder}/{INDEX_FILE}")
    if saved is None or saved.get("version") != INDEX_VERSION:
        return None
    losers = {shard: (int(index), tuple(parts), str(decision))
              for shard, (index, parts, decision) in saved["losers"].items()}
    shared = {shard: (int(index), tuple(parts)) for shard, (index, parts) in saved["shared"].items()}
    return IdIndex(store.url, folder, losers, output_options, shared, texts)


def build_id_index(store: OutputStore, output_options: dict[str, Any], options: CorpusOptions,
                   shards: Sequence[Shard], texts: bool, progress: IndexProgress | None = None) -> IdIndex | None:
    """The id index of the plan ``shards`` (module doc), built with Ray tasks unless the output holds it;
    ``None`` when no two shards can share an id (nor, with ``texts``, a text). ``output_options``:
    the output's storage options (the tasks open it too); ``progress`` hears of the reading as it goes.
    Ray must be up."""
    if not needs_id_index(options, shards, texts):
        return None
    if (stored := stored_id_index(store, output_options, shards, texts)) is not None:
        return stored
    for name in store.list(IDS_DIR):  # indexes of earlier plans, and a half-built one
        store.fs.rm(store.path(f"{IDS_DIR}/{name}"), recursive=True)
    read = [(i, ids_can_repeat(options, shard)) for i, shard in enumerate(shards)
            if shard.bad_file is None and (texts or ids_can_repeat(options, shard))]
    _build(store, output_options, options, shards, read, texts, f"{IDS_DIR}/{index_key(shards, texts)}",
           progress or IndexProgress())
    return stored_id_index(store, output_options, shards, texts)


class IndexProgress:
    """Hears how the reading of an id index goes (this one hears nothing): :meth:`reading` once, with
    what is to read, then :meth:`read` as spill tasks finish."""

    def reading(self, documents: int, shards: int) -> None:
        """The ids (and texts) of ``documents`` documents in ``shards`` shards are about to be read."""

    def read(self, documents: int) -> None:
        """``documents`` of them are read so far."""


def _build(store: OutputStore, output_options: dict[str, Any], options: CorpusOptions, shards: Sequence[Shard],
           read: list[tuple[int, bool]], texts: bool, folder: str, progress: IndexProgress) -> None:
    """Index ``read``: the shards to read, each as (its place in the plan, whether its ids are
    indexed), and (``texts``) their texts."""
    total = sum(shards[i].size for i, _ in read)
    count = partition_count(total)
    groups: list[list[tuple[int, bool]]] = [[]]
    documents = 0
    for entry in read:
        size = shards[entry[0]].size
        if groups[-1] and documents + size > SPILL_TASK_DOCS:
            groups.append([])
            documents = 0
        groups[-1].append(entry)
        documents += size
    progress.reading(total, len(read))
    spill_task = ray.remote(num_cpus=1, max_retries=3)(_spill_ids)
    spilling = {spill_task.remote(store.url, output_options, options, f"{folder}/spill", f"{number:06d}",
                                  [(i, shards[i], ids) for i, ids in group], texts, count, SPILL_BATCH_DOCS):
                sum(shards[i].size for i, _ in group) for number, group in enumerate(groups)}
    so_far = 0
    while spilling:
        done, _ = ray.wait(list(spilling), num_returns=1)
        ray.get(done)  # a task that failed (after Ray's retries) fails the index
        so_far += spilling.pop(done[0])
        progress.read(so_far)
    group_task = ray.remote(num_cpus=1, max_retries=3)(_find_losers)
    shared_task = ray.remote(num_cpus=1, max_retries=3)(_find_shared)
    paths = [shard.sources[0] if shard.sources else "" for shard in shards]
    shared_refs = [shared_task.remote(store.url, output_options, folder, k) for k in range(count)]
    found = ray.get([group_task.remote(store.url, output_options, folder, k, paths) for k in range(count)])
    shared: dict[int, list[int]] = {}  # shard → partitions listing its shared texts
    for k, holders in enumerate(ray.get(shared_refs)):
        for index in holders:
            shared.setdefault(index, []).append(k)
    losers: dict[int, tuple[list[int], list[int]]] = {}  # shard → partitions, [losers, sum of their hashes]
    for k, hit in enumerate(found):
        for index, (number, hashes) in hit.items():
            parts, tally = losers.setdefault(index, ([], [0, 0]))
            parts.append(k)
            tally[0] += number
            tally[1] = (tally[1] + hashes) % 2**64
    saved = {"version": INDEX_VERSION, "partitions": count,
             "losers": {shards[index].id: [index, parts, f"{number}:{hashes:016x}"]
                        for index, (parts, (number, hashes)) in sorted(losers.items())},
             "shared": {shards[index].id: [index, parts] for index, parts in sorted(shared.items())}}
    store.write_json(f"{folder}/{INDEX_FILE}", saved)  # last: the index is whole once this exists
    for spilled in ("spill", "spill-texts"):
        if store.fs.exists(store.path(f"{folder}/{spilled}")):
            store.fs.rm(store.path(f"{folder}/{spilled}"), recursive=True)


def _spill_ids(output: str, output_options: dict[str, Any], options: CorpusOptions, folder: str, name: str,
               shards: list[tuple[int, Shard, bool]], texts: bool, count: int, batch_docs: int) -> None:
    """Ray task: the ids of ``shards`` (each with its place in the plan, and whether its ids are
    indexed) into the partitions under ``folder``, and (``texts``) their texts' digests under
    ``<folder>-texts``, spilled every ``batch_docs`` documents (after a shard).

    A shard that cannot be read holds no id: its own task meets the same error and reports it (the
    shard is not committed), and the run after the file is fixed plans, and indexes, it anew.
    """
    store = OutputStore(output, output_options)
    batch = _SpillBatch()
    written = 0
    with no_cycle_collection():
        for index, shard, ids in shards:
            try:
                documents = list(read_ids(options, shard))
            except CorpusError:
                continue
            batch.add(index, documents, ids=ids, texts=texts)
            if len(batch) >= batch_docs:
                batch.spill(store, folder, f"{name}-{written:04d}", count)
                batch, written = _SpillBatch(), written + 1
    batch.spill(store, folder, f"{name}-{written:04d}", count)


class _SpillBatch:
    """The spill rows of some documents, held until they are written to the partitions."""

    def __init__(self) -> None:
        self.ids: dict[str, list[Any]] = {column: [] for column in _SPILL_SCHEMA.names}
        self.texts: dict[str, list[Any]] = {column: [] for column in _TEXT_SCHEMA.names}
        self.documents = 0

    def __len__(self) -> int:
        return self.documents

    def add(self, shard: int, documents: list[tuple[int, str, str, int | None, int | None, bool]], *, ids: bool,
            texts: bool) -> None:
        """The documents of shard ``shard`` (as ``read_ids`` yields them): their ids and places
        (``ids``), and their texts' digests (``texts``)."""
        self.documents += len(documents)
        if not documents:
            return
        positions, doc_ids, bodies, rows, lines, integers = zip(*documents, strict=True)
        shards = [shard] * len(documents)
        if ids:
            for column, values in zip(_SPILL_SCHEMA.names, (doc_ids, shards, positions, rows, lines, integers),
                                      strict=True):
                self.ids[column].extend(values)
        if texts:
            for column, values in zip(_TEXT_SCHEMA.names, (_text_digests(bodies), shards, positions),
                                      strict=True):
                self.texts[column].extend(values)

    def spill(self, store: OutputStore, folder: str, name: str, count: int) -> None:
        """The rows (ids under ``folder``, text digests under ``<folder>-texts``) into their partitions."""
        for rows, schema, under in ((self.ids, _SPILL_SCHEMA, folder), (self.texts, _TEXT_SCHEMA, f"{folder}-texts")):
            if rows["shard"]:
                spill(store.fs, store.path(under), name, pa.table(rows, schema=schema), count)


def _find_losers(output: str, output_options: dict[str, Any], folder: str, k: int,
                 paths: list[str]) -> dict[int, tuple[int, int]]:
    """Ray task: partition ``k``'s ids held by more than one shard; every occurrence outside the first
    shard loses to the first occurrence. Writes ``losers/p<k>.parquet``; returns, per losing shard,
    how many of its documents lose and the sum of their positions' hashes (a digest that does not
    depend on how the ids were partitioned)."""
    store = OutputStore(output, output_options)
    table = repeated_in_partition(store.fs, store.path(f"{folder}/spill"), k, ["shard", "position"])
    if table is None:
        return {}
    losers: dict[str, list[Any]] = {name: [] for name in ("shard", "position", "kept_path", "kept_row",
                                                          "kept_line", "kept_integer")}
    first: dict[str, Any] | None = None
    for row in table.to_pylist():
        if first is None or row["id"] != first["id"]:
            first = row  # the id's first occurrence in plan order: it keeps the id
            continue
        if row["shard"] == first["shard"]:
            continue  # a repeat within the shard: read_shard rejects it itself
        for column, value in zip(losers, (row["shard"], row["position"], paths[first["shard"]], first["row"],
                                          first["line"], first["integer"]), strict=True):
            losers[column].append(value)
    if not losers["shard"]:
        return {}
    table = pa.table(losers, schema=pa.schema([("shard", pa.int32()), ("position", pa.int32()),
                                               ("kept_path", pa.string()), ("kept_row", pa.int64()),
                                               ("kept_line", pa.int64()), ("kept_integer", pa.bool_())]))
    store.write_atomic(f"{folder}/losers/p{k}.parquet", lambda handle: pq.write_table(table, handle))
    tally: dict[int, tuple[int, int]] = {}
    for index, position in zip(losers["shard"], losers["position"], strict=True):
        number, hashes = tally.get(index, (0, 0))
        tally[index] = (number + 1, (hashes + _position_hash(position)) % 2**64)
    return tally


def _find_shared(output: str, output_options: dict[str, Any], folder: str, k: int) -> list[int]:
    """Ray task: partition ``k``'s texts held by more than one shard. Writes ``shared/p<k>.parquet``
    (every document holding one: shard, position); returns the shards listed there."""
    store = OutputStore(output, output_options)
    table = repeated_in_partition(store.fs, store.path(f"{folder}/spill-texts"), k, [])
    if table is None:
        return []
    holders = table.group_by("id").aggregate([("shard", "count_distinct")])
    across = holders.filter(pc.greater(holders["shard_count_distinct"], 1)).column("id")
    table = table.filter(pc.is_in(table["id"], value_set=across.combine_chunks())).select(["shard", "position"])
    if not table.num_rows:
        return []
    store.write_atomic(f"{folder}/shared/p{k}.parquet", lambda handle: pq.write_table(table, handle))
    return sorted(pc.unique(table["shard"]).to_pylist())


def _text_digests(texts: Sequence[str]) -> list[int]:
    """Each text's digest as a signed 64-bit integer (blake2b, 8 bytes, little-endian), converted in one go."""
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest() for text in texts])
    return np.frombuffer(digests, dtype="<i8").tolist()


def _position_hash(position: int) -> int:
    return int.from_bytes(hashlib.blake2b(position.to_bytes(8, "little"), digest_size=8).digest(), "little")
