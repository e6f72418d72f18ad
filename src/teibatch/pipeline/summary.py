"""What a run did: the counts, timings and per-server numbers that become its report."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from teibatch import __version__
from teibatch.corpus import LeftOut
from teibatch.errors import StorageFull
from teibatch.pipeline.chunks import ChunkTally
from teibatch.pipeline.progress import SilentReporter
from teibatch.pipeline.shard import ShardOutcome, peak_rss_mb


@dataclass
class RunSummary:
    """What a run did; also the body of its report."""

    run_id: str
    status: str = "running"
    shards_total: int = 0
    shards_skipped: int = 0
    shards_committed: int = 0
    shards_failed: int = 0
    documents_read: int = 0
    embedded: int = 0
    reused: int = 0
    truncated: int = 0
    deduplicated: int = 0  # of the embedded: their text was sent once for another id of the run
    rejected: Counter[str] = field(default_factory=Counter)
    nodes: Counter[str] = field(default_factory=Counter)
    worker_peak_rss_mb: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    ray_background: float | None = None  # CPU seconds of a private Ray's own processes (pipeline/ray_upkeep.py)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    corpus_errors: list[str] = field(default_factory=list)
    unfinished: int = 0
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    progress: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] | None = None  # what the rented instances cost, when the provider rents
    storage_full: StorageFull | None = None  # what stopped the run: no room left where it writes
    chunking: ChunkTally | None = None  # a chunked run: documents, chunks, tokens, chunk lengths
    tokenizer: str | None = None  # a chunked run: the token rule it counted with
    replacements: list[dict[str, Any]] = field(default_factory=list)  # servers the cloud took back mid-run
    left_out: LeftOut = field(default_factory=LeftOut)  # files the corpus path matched that the run did not read
    parts_missing: list[str] = field(default_factory=list)  # committed shards whose part was gone: embedded again

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def add(self, outcome: ShardOutcome) -> None:
        self.shards_committed += 1
        self.documents_read += outcome.read
        if outcome.chunks is not None:  # rows are chunks: count documents
            self.embedded += outcome.chunks.documents - outcome.chunks.documents_reused
            self.reused += outcome.chunks.documents_reused
            self.deduplicated += outcome.chunks.documents_deduplicated
            if self.chunking is not None:
                self.chunking.add(outcome.chunks)
        else:
            self.embedded += outcome.rows - outcome.reused
            self.reused += outcome.reused
            self.deduplicated += outcome.deduplicated
        self.truncated += outcome.truncated
        self.rejected.update(outcome.reject_reasons)
        if outcome.node:
            self.nodes[outcome.node] += 1
        self.worker_peak_rss_mb = max(self.worker_peak_rss_mb, outcome.peak_rss_mb)

    def to_json(self) -> dict[str, Any]:
        embed_s = self.timings.get("embed_s", 0.0)
        return {
            "run_id": self.run_id, "status": self.status, "teibatch_version": __version__,
            "shards": {"total": self.shards_total, "skipped_committed": self.shards_skipped,
                       "committed": self.shards_committed, "failed": self.shards_failed},
            "documents": {"read": self.documents_read, "embedded": self.embedded, "truncated": self.truncated,
                          "deduplicated": self.deduplicated, "skipped_unchanged": self.reused,
                          "rejected": self.rejected_total,
                          "waiting_for_servers": self.unfinished,
                          "rejected_by_reason": dict(sorted(self.rejected.items()))},
            "shards_per_node": dict(sorted(self.nodes.items())),
            "memory": {"driver_peak_rss_mb": peak_rss_mb(), "worker_peak_rss_mb": self.worker_peak_rss_mb},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "ray_background": round(self.ray_background, 3) if self.ray_background is not None else None,
            "throughput_docs_per_s": round(self.embedded / embed_s, 1) if embed_s > 0 else None,
            "servers": self.servers, "errors": self.errors,
            "started_at": self.started_at, "progress": self.progress, "events": self.events,
            "corpus": {"left_out": self.left_out.to_json()}, "parts_missing": self.parts_missing,
            **({"cost": self.cost} if self.cost is not None else {}),
            **({"replacements": self.replacements} if self.replacements else {}),
            **({"chunking": {**self.chunking.to_json(), "tokenizer": self._tokenizer_said()}}
               if self.chunking is not None else {}),
            **({"storage_full": {"path": self.storage_full.path, "needed_bytes": self.storage_full.needed_bytes,
                                 "temporary": self.storage_full.temporary}} if self.storage_full is not None else {}),
        }

    def _tokenizer_said(self) -> str | None:
        """The token rule, with the requests it took when it was the servers' ``/tokenize``."""
        stats = self.chunking.tokenize if self.chunking is not None else None
        if self.tokenizer is None or stats is None:
            return self.tokenizer
        return f"{self.tokenizer}, {stats.requests:,} requests"


class SummaryRecorder(SilentReporter):
    """Writes what the run reports into its summary: every event, and progress after every shard.

    ``progress`` holds one point per finished shard (seconds since the run began, shards and
    documents done), ``events`` every message with its name: the run report's timeline.
    """

    def __init__(self, summary: RunSummary) -> None:
        self.summary = summary
        self._clock = time.monotonic()
        self._shards = self._documents = 0

    def _now(self) -> float:
        return round(time.monotonic() - self._clock, 3)

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.summary.events.append({"t": self._now(), "event": event, "message": text, **fields})

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        self._shards += shards
        self._documents += documents
        self.summary.progress.append({"t": self._now(), "shards": self._shards, "documents": self._documents,
                                      **fields})


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
