"""What a shard embeds, unit by unit, and how the vectors become rows, document by document.

Without chunking a unit is a document: its id, its text, its content hash. With chunking
(``chunking:`` in the job) a unit is a chunk of a document (``corpus/chunking.py``): id
``<doc id>#<chunk index>``, the text sent (prefix, title, passage), and a content hash of that
text under the vector and chunking options. The units of one document are always listed together,
so the rows of a shard are handed to its part a whole document at a time: a document whose chunk
the servers finally refused is left out whole (one reject), never half-indexed.

With ``chunking.document_vector: mean`` each document written also gets one row in the shard's
documents part: the mean of its chunks' vectors weighted by their tokens, renormalized to unit length.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from teibatch.corpus import (
    REJECT_EMPTY_TEXT,
    REJECT_UNCHUNKABLE,
    ApproxTokenCounter,
    ChunkedDocument,
    Chunker,
    ChunkingOptions,
    Document,
    HFTokenCounter,
    Reject,
    TokenCounter,
    content_hasher,
)
from teibatch.corpus.token_count import require_tokenizers
from teibatch.endpoint import Endpoint
from teibatch.sink import VectorSchema, VectorsPart, documents_table, vectors_table
from teibatch.sparse import Vector, vector_rows
from teibatch.tei import EmbedResult
from teibatch.tei.info import CHARS_PER_TOKEN_LIMIT, ClientLimits
from teibatch.tei.tokenize import TEXT_REFUSALS, RouteTokenCounter, TokenizeStats
from teibatch.token_cuts import CUTS_NONE, CUTS_TOKENS

COUNTER_HASHING = "builtin-hashing"
COUNTER_FILE = "tokenizer.json"
COUNTER_CHARS = "chars"
COUNTER_ROUTE = "tokenize-route"

# Documents cut together: one ``encode_batch`` for all of them, small enough that the first chunks
# reach the senders at once.
CHUNK_BATCH_DOCS = 64
CHUNK_BATCH_CHARS = 1 << 20
# Threads ``tokenizers`` may use in one shard task, unless RAYON_NUM_THREADS says otherwise: a task
# holds one Ray CPU, and several tasks run side by side beside the senders (and local servers).
TOKENIZER_THREADS = 1
# The report's chunk-length histogram: chunks by their tokens, up to each bound (the last: above it).
HISTOGRAM_BOUNDS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# The histogram's buckets in order: ``1-32``, ``33-64``, … ``>8192``.
HISTOGRAM_LABELS = (*(f"{low + 1}-{high}" for low, high in itertools.pairwise((0, *HISTOGRAM_BOUNDS))),
                    f">{HISTOGRAM_BOUNDS[-1]}")
TITLE_SEPARATOR = "\n"
REJECT_TOKENIZE_FAILED = "tokenize_failed"
"""The reject reason for a document whose text the servers' ``/tokenize`` refuses even in pieces
(the detail is the server's message): the rest of its shard is chunked and written."""


@dataclass(frozen=True)
class TokenizeRoute:
    """The servers' ``/tokenize`` as a shard task reaches it: the run's endpoints (their API key
    travels with them, as to the senders; ``Endpoint`` keeps it out of every ``repr``), the smallest
    of the run's client limits towards them, the job's ``prompt_name`` and its request options."""

    endpoints: tuple[Endpoint, ...]
    limits: ClientLimits
    prompt_name: str | None
    timeout: float
    max_retries: int
    max_chars: int | None = None  # characters per /tokenize input: the servers' max_input_length × 250

    @classmethod
    def over(cls, endpoints: Sequence[Endpoint], limits: Sequence[ClientLimits], *, prompt_name: str | None,
             timeout: float, max_retries: int, max_input_length: int | None = None) -> TokenizeRoute:
        """The route over ``endpoints``, within the smallest of each one's ``limits``; ``max_input_length``,
        the smallest of theirs, sets the characters an input may have (TEI refuses more on ``/tokenize``)."""
        smallest = ClientLimits(max_batch_size=min(limit.max_batch_size for limit in limits),
                                max_inflight_inputs=min(limit.max_inflight_inputs for limit in limits),
                                payload_limit=min(limit.payload_limit for limit in limits))
        max_chars = None if max_input_length is None else max_input_length * CHARS_PER_TOKEN_LIMIT
        return cls(tuple(endpoints), smallest, prompt_name, timeout, max_retries, max_chars)


@dataclass(frozen=True)
class CounterSource:
    """A token rule as a shard task receives it (``pipeline/tokenizer_choice.py`` picks it): ``kind``
    (:data:`COUNTER_HASHING`, :data:`COUNTER_FILE`, :data:`COUNTER_CHARS`, :data:`COUNTER_ROUTE`),
    ``label`` (what the report says), for a file its text (the workers of a cluster need not see the
    driver's files), for the servers' ``/tokenize`` the route."""

    kind: str
    label: str
    config: str | None = None
    route: TokenizeRoute | None = None

    def counter(self) -> TokenCounter | None:
        """The counter, built once per process; ``None`` for ``chars``, whose chunker counts characters.

        A ``/tokenize`` counter holds connections and a thread: it stays open in this process until
        :meth:`release` (a shard task's end)."""
        if self.route is not None:
            return _open_route(self.route)
        return _counter(self)

    def release(self) -> TokenizeStats | None:
        """Close this process's ``/tokenize`` counter, if one is open, and say what it sent; ``None``
        for the other rules, which hold nothing."""
        if self.route is None:
            return None
        with _routes_lock:
            counter = _routes.pop(self.route, None)
        if counter is None:
            return None
        counter.close()
        return counter.stats


_routes: dict[TokenizeRoute, RouteTokenCounter] = {}
_routes_lock = threading.Lock()


def _open_route(route: TokenizeRoute) -> RouteTokenCounter:
    """The process's counter over ``route``, opened on first use: the threads of one shard task share it."""
    with _routes_lock:
        counter = _routes.get(route)
        if counter is None:
            counter = RouteTokenCounter(route.endpoints, route.limits, prompt_name=route.prompt_name,
                                        timeout=route.timeout, max_retries=route.max_retries,
                                        max_chars=route.max_chars)
            _routes[route] = counter
        return counter


@functools.lru_cache(maxsize=4)
def _counter(source: CounterSource) -> TokenCounter | None:
    if source.kind == COUNTER_HASHING:
        return ApproxTokenCounter()
    if source.kind == COUNTER_FILE and source.config is not None:
        return HFTokenCounter(require_tokenizers().Tokenizer.from_str(source.config))
    return None


@dataclass(frozen=True)
class ChunkPlan:
    """How a shard task cuts its documents: the job's ``chunking`` block with ``max_tokens`` resolved
    against the servers, and the token rule to count with."""

    options: ChunkingOptions
    source: CounterSource
    prefix: str = ""
    titled: bool = False
    store_text: bool = False
    document_vector: bool = False

    def chunker(self) -> Chunker:
        return Chunker(self.options, self.source.counter())

    def prefix_of(self, document: Document) -> str:
        """What starts each of ``document``'s chunks: the fixed prefix, then its title and a line break."""
        if self.titled and document.title:
            return f"{self.prefix}{document.title}{TITLE_SEPARATOR}"
        return self.prefix


def limit_tokenizer_threads() -> None:
    """Keep ``tokenizers`` to :data:`TOKENIZER_THREADS` in this (shard worker) process, unless the
    environment sets RAYON_NUM_THREADS; it takes every core otherwise. Call before its first batch."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(TOKENIZER_THREADS))


def chunk_batch(chunker: Chunker, texts: Sequence[str], prefixes: Sequence[str]) -> list[ChunkedDocument]:
    """``chunker``'s chunks of ``texts``; over the servers' ``/tokenize``, with its requests batched.

    That counter promises nothing when a text is cut (``cuts: none``), so the chunker counts every
    chunk again as sent, one text at a time: a request per chunk. Here the chunker first proposes
    its chunks trusting the documents' own tokens (what the chunks would be if counts added up),
    all the proposed chunks are counted in one call (requests of ``max_client_batch_size`` texts),
    and the chunker runs again over those answers. The second run is the one kept and asks the
    servers what it was not told, so its chunks are exactly those of counting one chunk at a time.
    """
    counter = chunker.counter
    if not isinstance(counter, RouteTokenCounter) or counter.cuts != CUTS_NONE:
        return chunker.chunk_batch(texts, prefixes)
    remembered = _Remembered(counter)
    remembered.counts(sorted({prefix for prefix in prefixes if prefix}))
    proposed = Chunker(chunker.options, _Proposing(remembered)).chunk_batch(texts, prefixes)
    remembered.counts([chunk.text for cut in proposed for chunk in cut.chunks])
    return Chunker(chunker.options, remembered).chunk_batch(texts, prefixes)


class _Remembered:
    """A ``/tokenize`` counter that keeps its answers for one batch of documents (a token counter)."""

    def __init__(self, route: RouteTokenCounter) -> None:
        self.route, self.cuts = route, route.cuts
        self.known_offsets: dict[str, Sequence[tuple[int, int]]] = {}
        self.known_counts: dict[str, int] = {}

    @property
    def special_tokens(self) -> int:
        return self.route.special_tokens

    def offsets(self, texts: Sequence[str]) -> list[Sequence[tuple[int, int]]]:
        missing = [text for text in dict.fromkeys(texts) if text not in self.known_offsets]
        if missing:
            self.known_offsets.update(zip(missing, self.route.offsets(missing), strict=True))
        return [self.known_offsets[text] for text in texts]

    def counts(self, texts: Sequence[str]) -> list[int]:
        missing = [text for text in dict.fromkeys(texts) if text not in self.known_counts]
        if missing:
            self.known_counts.update(zip(missing, self.route.counts(missing), strict=True))
        return [self.known_counts[text] for text in texts]


class _Proposing:
    """The chunker's first run over a :class:`_Remembered`: counts add up at every token (``cuts:
    tokens``), and a text not counted yet is guessed at the documents' own tokens per character; it
    asks only for the documents' offsets."""

    cuts = CUTS_TOKENS

    def __init__(self, remembered: _Remembered) -> None:
        self.remembered = remembered
        self.special_tokens = remembered.special_tokens
        self._per_char: float | None = None

    def offsets(self, texts: Sequence[str]) -> list[Sequence[tuple[int, int]]]:
        spans = self.remembered.offsets(texts)
        chars = sum(len(text) for text in texts)
        self._per_char = sum(len(s) for s in spans) / chars if chars else 0.0
        return spans

    def counts(self, texts: Sequence[str]) -> list[int]:
        known, per_char = self.remembered.known_counts, self._per_char or 0.0
        return [known[text] if text in known else self.special_tokens + math.ceil(len(text) * per_char)
                for text in texts]


# The counts of a :class:`ChunkTally`, in the order the report lists them.
TALLY_COUNTS = ("documents", "documents_reused", "documents_deduplicated", "chunks", "chunks_reused",
                "chunks_deduplicated", "tokens_embedded", "document_tokens")


@dataclass
class ChunkTally:
    """A shard's chunking counts for the report: documents and chunks written (and of those reused
    from an earlier run, and chunks that copied the vector of the same text sent for another), tokens
    sent now and in the documents, and the chunks by length."""

    documents: int = 0
    documents_reused: int = 0
    documents_deduplicated: int = 0  # every chunk written with a copied vector
    chunks: int = 0
    chunks_reused: int = 0
    chunks_deduplicated: int = 0  # written with the vector of the same text sent for another chunk
    tokens_embedded: int = 0
    document_tokens: int = 0
    histogram: Counter[str] = field(default_factory=Counter)
    tokenize: TokenizeStats | None = None  # counted by the servers' /tokenize: what was sent there

    def add(self, other: ChunkTally) -> None:
        for name in TALLY_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.histogram.update(other.histogram)
        self.add_tokenize(other.tokenize)

    def add_tokenize(self, stats: TokenizeStats | None) -> None:
        """Requests sent to the servers' ``/tokenize`` (a shard task's, or the driver's own)."""
        if stats is not None:
            self.tokenize = stats if self.tokenize is None else self.tokenize + stats

    def to_json(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in TALLY_COUNTS},
                "histogram": {label: self.histogram[label] for label in HISTOGRAM_LABELS if self.histogram[label]},
                **({"tokenize": self.tokenize.to_json()} if self.tokenize is not None else {})}


def histogram_label(tokens: int) -> str:
    return HISTOGRAM_LABELS[int(np.searchsorted(HISTOGRAM_BOUNDS, tokens))]


class Units:
    """A shard's units in order, as they are read: one per document, or one per chunk (``plan``).

    ``doc[u]`` is the position (in the shard's documents) of unit ``u``'s document, ``first[d]``
    the first unit of document ``d``; the chunk lists hold each chunk's place in its document.
    """

    def __init__(self, plan: ChunkPlan | None, hash_options: dict[str, Any]) -> None:
        self.plan, self.hash_options = plan, hash_options
        self.hash_text = content_hasher(hash_options)
        self.ids: list[str] = []
        self.hashes: list[str] = []
        self.doc: list[int] = []
        self.first: list[int] = []
        self.index: list[int] = []
        self.count: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.tokens: list[int] = []
        self.texts: list[str] = []  # with chunking.store_text only
        self.document_tokens = 0

    def __len__(self) -> int:
        return len(self.ids)

    def expand(self, documents: Iterable[Document], record: list[Document],
               rejects: list[Reject]) -> Iterator[tuple[int, str]]:
        """``(unit, text to send)`` for each unit of ``documents``; each document with units is
        appended to ``record``, one the chunker cannot cut to ``rejects`` instead."""
        if self.plan is None:  # a unit per document: _add_document and _add, inline (a shard may hold millions)
            ids, hashes, doc, first, hash_text = self.ids, self.hashes, self.doc, self.first, self.hash_text
            for document in documents:
                unit = len(ids)
                doc.append(len(first))
                first.append(unit)
                record.append(document)
                ids.append(document.id)
                hashes.append(hash_text(document.text))
                yield unit, document.text
            return
        batch: list[Document] = []
        chars = 0
        for document in documents:
            batch.append(document)
            chars += len(document.text)
            if len(batch) >= CHUNK_BATCH_DOCS or chars >= CHUNK_BATCH_CHARS:
                yield from self._chunk(batch, record, rejects)
                batch, chars = [], 0
        yield from self._chunk(batch, record, rejects)

    def _chunk(self, batch: list[Document], record: list[Document],
               rejects: list[Reject]) -> Iterator[tuple[int, str]]:
        if not batch:
            return
        plan = self.plan
        assert plan is not None
        chunker = plan.chunker()
        try:
            chunked: list[ChunkedDocument | None] = list(
                chunk_batch(chunker, [d.text for d in batch], [plan.prefix_of(d) for d in batch]))
        except TEXT_REFUSALS:  # the servers' /tokenize refused a text: ask document by document
            chunked = [self._chunk_alone(chunker, plan, document, rejects) for document in batch]
        for document, cut in zip(batch, chunked, strict=True):
            if cut is None:
                continue
            if not cut.chunks:
                reason = REJECT_UNCHUNKABLE if cut.problem else REJECT_EMPTY_TEXT
                rejects.append(Reject(document.id, reason, cut.problem or "no text to embed between its whitespace"))
                continue
            self.document_tokens += cut.tokens
            first = len(self.ids)
            self._add_document(record, document)
            for chunk in cut.chunks:
                self._add(f"{document.id}#{chunk.index}", self.hash_text(chunk.text))
                self.index.append(chunk.index)
                self.count.append(len(cut.chunks))
                self.start.append(chunk.char_start)
                self.end.append(chunk.char_end)
                self.tokens.append(chunk.tokens)
                if plan.store_text:
                    self.texts.append(chunk.text)
            for unit, chunk in enumerate(cut.chunks, start=first):
                yield unit, chunk.text

    @staticmethod
    def _chunk_alone(chunker: Chunker, plan: ChunkPlan, document: Document,
                     rejects: list[Reject]) -> ChunkedDocument | None:
        """``document``'s chunks, or ``None`` and a ``tokenize_failed`` reject when the servers'
        ``/tokenize`` refuses its text (only a counter over that route raises these)."""
        try:
            return chunker.chunk(document.text, plan.prefix_of(document))
        except TEXT_REFUSALS as exc:
            rejects.append(Reject(document.id, REJECT_TOKENIZE_FAILED, f"the servers' /tokenize refused it: {exc}"))
            return None

    def _add_document(self, record: list[Document], document: Document) -> None:
        self.first.append(len(self.ids))
        record.append(document)

    def _add(self, unit_id: str, unit_hash: str) -> None:
        self.ids.append(unit_id)
        self.hashes.append(unit_hash)
        self.doc.append(len(self.first) - 1)

    def boundary(self, end: int) -> int:
        """The last document boundary at or before unit ``end`` (every unit before it is of a whole document)."""
        return end if end >= len(self.ids) else self.first[self.doc[end]]

    def describe(self, unit: int) -> str:
        """Which unit of its document ``unit`` is, for a reject's detail (empty without chunking)."""
        if self.plan is None:
            return ""
        return f"chunk {self.index[unit]} of {self.count[unit]} ({self.ids[unit]}): "


Reused = dict[int, tuple[str, Vector, bool]]
"""Units whose vector an earlier run's part holds: unit → (content hash, vector, truncated)."""


class RowsInOrder:
    """Hands a shard's vectors to its part in unit order, each document as soon as all its units are final.

    A unit is final once its chunk of the senders' results is back (they come back in order) or,
    when its vector is kept from an earlier run, once every unit before it is. A document with a unit
    the servers rejected is left out whole (it is in the rejects part).
    """

    def __init__(self, part: VectorsPart, schema: VectorSchema, documents: list[Document], units: Units,
                 reused: Reused, copies: Reused | None = None, late: Reused | None = None) -> None:
        self._part, self._schema = part, schema
        self._documents, self._units, self._reused = documents, units, reused
        # Units whose text another unit of the run sent (``pipeline/dedup.py``), and units sent after the others.
        self._copies = copies if copies is not None else {}
        self._late = late if late is not None else {}
        self.deduplicated = 0  # rows written with a copied vector
        self._given = 0  # units handed over (a document boundary)
        self._carried: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # final units after _given
        self._final = 0  # units final so far
        self.tally = ChunkTally()
        self.document_rows: list[Any] = []  # documents part tables (chunking.document_vector)

    def add(self, positions: list[int], result: EmbedResult) -> None:
        """``result`` for the units at ``positions``, and the reused ones before its last."""
        if positions:
            self._collect(positions[-1] + 1, (np.asarray(positions, dtype=np.int64), result))

    def finish(self) -> None:
        """The reused units after the last embedded one (every document has been read)."""
        self._collect(len(self._units), None)

    def _collect(self, end: int, embedded: tuple[np.ndarray, EmbedResult] | None) -> None:
        """Units up to ``end`` are final: those at ``embedded``'s positions from its result, the others
        reused; hand over the whole documents among them and keep the rest for later."""
        first = self._final
        if end <= first:
            return
        self._final = end
        if embedded is not None and len(embedded[0]) == end - first:
            result = embedded[1]  # no reused one among them
            vectors, ok, truncated = result.vectors, result.ok, result.truncated
        else:
            vectors = vector_rows(end - first, self._schema.dimension, self._schema.sparse)
            ok = np.zeros(end - first, dtype=bool)
            truncated = np.zeros(end - first, dtype=bool)
            if embedded is not None:
                at, result = embedded[0] - first, embedded[1]
                vectors[at], ok[at], truncated[at] = result.vectors, result.ok, result.truncated
            for position in range(first, end):
                previous = self._reused.get(position) or self._copies.get(position) or self._late.get(position)
                if previous is not None:
                    vectors[position - first], truncated[position - first] = previous[1], previous[2]
                    ok[position - first] = True
        if self._carried is not None:
            before = self._carried
            vectors, ok, truncated = (np.concatenate([before[0], vectors]), np.concatenate([before[1], ok]),
                                      np.concatenate([before[2], truncated]))
        cut = self._units.boundary(end) - self._given
        self._carried = (vectors[cut:], ok[cut:], truncated[cut:]) if cut < len(ok) else None
        if cut > 0:
            self._hand_over(vectors[:cut], ok[:cut], truncated[:cut])

    def _hand_over(self, vectors: np.ndarray, ok: np.ndarray, truncated: np.ndarray) -> None:
        """The units from ``_given`` on, whole documents: rows for every document all of whose units are ok."""
        first, units = self._given, self._units
        self._given += len(ok)
        keep = ok
        if not ok.all() and units.plan is not None:  # one refused chunk leaves its whole document out
            docs = np.asarray(units.doc[first:self._given])
            keep = ok & ~np.isin(docs, docs[~ok])
        kept = np.flatnonzero(keep)
        if len(kept) < len(ok):
            vectors, truncated = vectors[kept], truncated[kept]
        rows = (kept + first).tolist()  # plain ints: the per-unit lists below index Python lists
        if self._copies:
            self.deduplicated += sum(1 for u in rows if u in self._copies)
        documents, doc_of = self._documents, units.doc
        chunks: dict[str, list[Any]] | None = None
        if units.plan is not None:
            chunks = {"doc_id": [documents[doc_of[u]].id for u in rows], "chunk_index": [units.index[u] for u in rows],
                      "chunk_count": [units.count[u] for u in rows], "char_start": [units.start[u] for u in rows],
                      "char_end": [units.end[u] for u in rows],
                      **({"text": [units.texts[u] for u in rows]} if units.plan.store_text else {})}
            self._count(rows)
            if units.plan.document_vector and rows:
                self._document_rows(rows, vectors)
        self._part.add(vectors_table(
            self._schema, ids=[units.ids[u] for u in rows], vectors=vectors, hashes=[units.hashes[u] for u in rows],
            truncated=truncated, chunks=chunks,
            kept={name: [documents[doc_of[u]].fields.get(name) for u in rows] for name in self._schema.kept}))

    def _count(self, rows: list[int]) -> None:
        units, tally = self._units, self.tally
        starts = [u for u in rows if units.index[u] == 0]
        tally.documents += len(starts)
        tally.documents_reused += sum(1 for u in starts if all(v in self._reused for v in range(u, u + units.count[u])))
        tally.documents_deduplicated += sum(
            1 for u in starts if all(v in self._copies for v in range(u, u + units.count[u])))
        tally.chunks += len(rows)
        for u in rows:
            tally.histogram[histogram_label(units.tokens[u])] += 1
            if u in self._reused:
                tally.chunks_reused += 1
            elif u in self._copies:
                tally.chunks_deduplicated += 1
            else:
                tally.tokens_embedded += units.tokens[u]

    def _document_rows(self, rows: list[int], vectors: np.ndarray) -> None:
        """One documents-part row per document in ``rows`` (each there whole, in order)."""
        units = self._units
        starts = np.flatnonzero(np.asarray([units.index[u] == 0 for u in rows]))
        weights = np.asarray([units.tokens[u] for u in rows], dtype=np.float64)[:, None]
        means = np.add.reduceat(vectors.astype(np.float64) * weights, starts, axis=0)
        norms = np.linalg.norm(means, axis=1, keepdims=True)
        means = (means / np.where(norms > 0, norms, 1.0)).astype(np.float32)
        documents = [self._documents[units.doc[rows[s]]] for s in starts]
        hashes = [units.hash_text(d.text) for d in documents]
        self.document_rows.append(documents_table(
            self._schema, ids=[d.id for d in documents], vectors=means, hashes=hashes,
            chunk_counts=[units.count[rows[s]] for s in starts],
            kept={name: [d.fields.get(name) for d in documents] for name in self._schema.kept}))
