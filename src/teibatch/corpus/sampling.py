"""A sample spread over the whole corpus: short runs of documents at evenly spaced places.

A corpus is often ordered: short documents first, a file of long ones last, one source after
another. Its first documents then say little about the rest, so an estimate made from them
(``teibatch plan``'s chunks and tokens, a run's chunks per document) can be off several times over.
:func:`spread_sample` instead cuts the planned shards into ``pieces`` runs of consecutive rows, one
in the middle of each of ``pieces`` equal stretches of the corpus in its planned order: across its
files, in proportion to their rows, and across each file. Each run is a :class:`Shard` of its own
(the same id as the shard it comes from), read with ``read_shard(..., verify=False)``.

Runs of neighbouring rows, not single rows: a reader reaches a row by reading the file up to it, so
a few rows at each place cost little more than one; and the runs' spread from each other is what
:func:`estimate_total` turns into a range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from teibatch.corpus.records import Shard

SAMPLE_PIECES = 50
"""How many places of the corpus a sample reads (fewer when it is to hold fewer documents)."""

SPREAD_Z = 2.0
"""How many standard errors either side of an estimate its range reaches (about 95% of samples)."""


def spread_sample(shards: Sequence[Shard], documents: int, pieces: int = SAMPLE_PIECES) -> list[Shard]:
    """Runs of rows that together hold about ``documents`` rows, spread over ``shards`` (see the module
    docstring); every shard whole, in order, when they hold no more than ``documents`` rows."""
    total = sum(shard.size for shard in shards)
    if total <= documents:
        return [shard for shard in shards if shard.size]
    pieces = max(2, min(pieces, documents))  # two at least: their spread is the range
    per = max(1, documents // pieces)
    runs: list[Shard] = []
    ends = _ends(shards)
    for k in range(pieces):
        middle = (2 * k + 1) * total // (2 * pieces)  # the middle of the k-th of `pieces` equal stretches
        index = next(i for i, end in enumerate(ends) if middle < end)
        shard = shards[index]
        offset = middle - (ends[index] - shard.size)
        first = max(0, min(offset - per // 2, shard.size - per))
        runs.append(_rows(shard, first, min(shard.size, first + per)))
    return runs


@dataclass(frozen=True)
class Estimate:
    """A total scaled up from a sample, with the range it most likely lies in (``low`` = ``high`` =
    ``value`` when the sample was the whole corpus)."""

    value: int
    low: int
    high: int


def estimate_total(counts: Sequence[tuple[int, float]], total_rows: int) -> Estimate:
    """The corpus's total of some count, from ``(rows, count)`` per sampled run (``rows`` read,
    ``count`` what they made): the runs' ratio scaled to ``total_rows``, and a range of
    :data:`SPREAD_Z` standard errors of that ratio across the runs (with the finite-corpus
    correction; never below what the sample itself made)."""
    rows = sum(r for r, _ in counts)
    made = sum(c for _, c in counts)
    if rows == 0:
        return Estimate(0, 0, 0)
    ratio = made / rows
    value = math.ceil(ratio * total_rows)
    unread = max(0.0, 1.0 - rows / total_rows) if total_rows else 0.0
    if len(counts) < 2 or unread == 0.0:  # the whole corpus, or no spread to measure
        return Estimate(value, value, value)
    mean_rows = rows / len(counts)
    spread = sum((c - ratio * r) ** 2 for r, c in counts) / (len(counts) - 1)
    error = math.sqrt(spread * unread / len(counts)) / mean_rows * total_rows
    low = max(math.ceil(made), math.floor(value - SPREAD_Z * error))
    return Estimate(value, low, max(value, math.ceil(value + SPREAD_Z * error)))


def _ends(shards: Sequence[Shard]) -> list[int]:
    """Each shard's end, in rows of the whole corpus."""
    ends, end = [], 0
    for shard in shards:
        end += shard.size
        ends.append(end)
    return ends


def _rows(shard: Shard, first: int, stop: int) -> Shard:
    """Rows ``first..stop`` of ``shard`` (counted from its start), as a shard of their own."""
    if shard.format == "text":  # one file a row
        return replace(shard, sources=shard.sources[first:stop], start=shard.start + first, stop=shard.start + stop)
    return replace(shard, start=shard.start + first, stop=shard.start + stop)
