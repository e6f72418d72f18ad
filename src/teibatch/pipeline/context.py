"""What a shard task needs to know, as one picklable record sent from the driver to Ray workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teibatch.corpus.records import CorpusOptions
from teibatch.endpoint import Endpoint
from teibatch.sink.parts import VectorSchema, WriteOptions
from teibatch.tei.info import ClientLimits
from teibatch.tei.packing import EmbedOptions


@dataclass(frozen=True)
class ServerPlan:
    """One server as every shard task sees it: where, and its share of the limits."""

    endpoint: Endpoint
    limits: ClientLimits


@dataclass(frozen=True)
class ShardContext:
    """Everything a shard task needs besides the shard itself."""

    corpus: CorpusOptions
    servers: tuple[ServerPlan, ...]
    route: str
    embed: EmbedOptions
    hash_options: dict[str, Any]
    schema: VectorSchema
    write: WriteOptions
    output: str
    output_options: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 6
    request_timeout: float = 60.0
    model_id: str | None = None
    api_key_env: str | None = None
