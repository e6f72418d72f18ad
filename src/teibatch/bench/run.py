"""The whole bench: read every server's ``/info``, plan the grid, measure its settings in turn
within the time allowed, and report what was measured with the recommendation.

The whole bench stops before ``max_seconds``: a setting that would not finish in time is not
started, and what was measured is reported with the reason it stopped.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from teibatch.bench.grid import Setting, plan_grid
from teibatch.bench.measure import DRAIN_S, measure, setting_seconds
from teibatch.bench.recommend import Recommendation, recommend
from teibatch.bench.results import SettingResult
from teibatch.bench.texts import TOKENIZE_TIMEOUT_S, count_tokens
from teibatch.endpoint import Endpoint
from teibatch.errors import CorpusMismatch, JobSpecError, ServerFault, TeiAuthError, TeiUnavailable, WrongModelKind
from teibatch.tei import EmbedOptions, EmbedRequest, RequestPacker, ServerInfo, TeiClient, open_client
from teibatch.tei.decode import ROUTE_EMBED
from teibatch.tei.info import DEFAULT_PAYLOAD_LIMIT

INFO_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class BenchSpec:
    """What to measure: the servers, the texts, and the bounds of the grid and of the time.

    ``started`` is when the command began (``time.monotonic``): ``max_seconds`` counts from there.
    """

    endpoints: tuple[Endpoint, ...]
    texts: tuple[str, ...]
    text_source: str
    max_settings: int
    seconds_per_setting: float
    max_seconds: float
    api_key_env: str | None = None
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class BenchReport:
    """Everything a bench measured; :meth:`to_json` is the documented ``--json`` output."""

    servers: tuple[tuple[str, ServerInfo], ...]
    text_source: str
    token_counts: tuple[int, ...]
    token_source: str
    grid: tuple[Setting, ...]
    results: tuple[SettingResult, ...]
    recommendation: Recommendation | None
    stopped_early: str | None
    seconds: float

    @property
    def best(self) -> SettingResult | None:
        """The result of the most tokens/s, ``None`` when no setting got an answer."""
        measured = [r for r in self.results if r.tokens]
        return max(measured, key=lambda r: r.tokens_per_s) if measured else None

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens/s of one server (card) at the best setting: what ``teibatch plan --bench`` takes."""
        best = self.best
        return None if best is None else best.tokens_per_s / len(self.servers)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` output, as ``docs/bench.md`` documents it."""
        best, per_card = self.best, self.tokens_per_s
        limits = ("model_id", "version", "max_client_batch_size", "max_concurrent_requests", "max_batch_tokens",
                  "max_input_length")
        return {
            "servers": [{"url": url, **{k: getattr(info, k) for k in limits}} for url, info in self.servers],
            "texts": {"source": self.text_source, "count": len(self.token_counts),
                      "mean_tokens": round(sum(self.token_counts) / max(1, len(self.token_counts)), 1),
                      "token_count": self.token_source},
            "settings": [s.to_json() for s in self.grid],
            "results": [r.to_json() for r in self.results],
            "best": None if best is None else {**best.setting.to_json(), "tokens_per_s": round(best.tokens_per_s, 1)},
            "recommendation": self.recommendation.to_json() if self.recommendation else None,
            "tokens_per_s": None if per_card is None else round(per_card, 1),
            "tokens_per_s_per_server": {} if best is None else {s.url: round(s.tokens_per_s, 1) for s in best.servers},
            "stopped_early": self.stopped_early is not None,
            "stopped_reason": self.stopped_early,
            "seconds": round(self.seconds, 2),
        }

    def save_json(self) -> dict[str, Any]:
        """The ``--save`` file: ``tokens_per_s`` of one card (what ``teibatch plan --bench`` reads) and
        where it comes from."""
        best, data = self.best, self.to_json()
        return {"tokens_per_s": data["tokens_per_s"], "source": "teibatch bench",
                "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "model_id": self.servers[0][1].model_id, "servers": [url for url, _ in self.servers],
                "setting": None if best is None else best.setting.to_json(),
                "client": data["recommendation"]["client"] if data["recommendation"] else None,
                "token_count": self.token_source}


def run_bench(spec: BenchSpec, on_result: Callable[[int, int, SettingResult], None] | None = None) -> BenchReport:
    """Measure ``spec``'s servers over the grid, calling ``on_result(index, settings, result)`` after
    each setting; stop before ``spec.max_seconds`` and say so in :attr:`BenchReport.stopped_early`."""
    return asyncio.run(_bench(spec, on_result))


async def _bench(spec: BenchSpec, on_result: Callable[[int, int, SettingResult], None] | None) -> BenchReport:
    deadline = spec.started + spec.max_seconds
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=1, payload_limit=spec.payload_limit)
    texts = [t for t in spec.texts if packer.fits_alone(packer.encode(t))]
    if not texts:
        raise CorpusMismatch(f"every text sampled is over the payload limit of {spec.payload_limit:,} bytes")
    # Connections are bounded by the workers: no cap of its own.
    async with open_client([e.url for e in spec.endpoints]) as http:
        timeout = setting_seconds(spec.seconds_per_setting) + DRAIN_S
        clients = [TeiClient(e, http, timeout=timeout, api_key_env=spec.api_key_env, normalized=True)
                   for e in spec.endpoints]
        infos = [await _meet(c, _left(deadline, INFO_TIMEOUT_S)) for c in clients]
        max_batch = min(i.max_client_batch_size for i in infos)
        max_inflight = min(i.max_concurrent_requests for i in infos)
        grid = plan_grid(max_batch, max_inflight, spec.max_settings)
        tokens, token_source = await count_tokens(http, spec.endpoints[0], texts, infos[0],
                                                  _left(deadline, TOKENIZE_TIMEOUT_S))
        bodies = {b: _requests(texts, tokens, b, spec.payload_limit) for b in {s.batch_size for s in grid}}
        results: list[SettingResult] = []
        stopped = None
        for i, setting in enumerate(grid):
            if time.monotonic() + setting_seconds(spec.seconds_per_setting) > deadline:
                stopped = f"--max-seconds {spec.max_seconds:g} reached after {i} of {len(grid)} settings"
                break
            try:
                results.append(await measure(setting, clients, bodies[setting.batch_size],
                                             seconds=spec.seconds_per_setting, deadline=deadline))
            except TeiUnavailable as exc:  # refused connections: the server went away mid-bench
                said = str(exc).removeprefix(f"{exc.server}: ")
                raise TeiUnavailable(f"{said} while measuring {setting.label()}: is the server still running?",
                                     server=exc.server, status_code=exc.status_code) from exc
            if on_result:
                on_result(i, len(grid), results[-1])
    if not results:
        raise JobSpecError(f"{spec.max_seconds:g} s were spent before the first setting (reading /info and the "
                           "texts): raise --max-seconds", key="--max-seconds")
    servers = tuple((c.url, info) for c, info in zip(clients, infos, strict=True))
    return BenchReport(servers, spec.text_source, tuple(tokens), token_source, tuple(grid), tuple(results),
                       recommend(results, infos), stopped, time.monotonic() - spec.started)


def _left(deadline: float, most: float) -> float:
    """A timeout of at most ``most`` seconds that ends by ``deadline`` (never under 0.1 s)."""
    return max(0.1, min(most, deadline - time.monotonic()))


async def _meet(client: TeiClient, timeout: float) -> ServerInfo:
    """``/info``, from a server that must already run and serve an embedding model."""
    try:
        info = await client.info(timeout=timeout)
    except TeiAuthError as exc:
        if client.api_key_env:
            raise  # its message names the variable that holds the wrong key
        raise TeiAuthError("401 Unauthorized: the server wants an API key; put it in an environment variable and "
                           "name that variable with --api-key-env (or the job's servers.api_key_env)",
                           server=exc.server, status_code=exc.status_code) from exc
    except TeiUnavailable as exc:
        if isinstance(exc, ServerFault):
            raise
        said = str(exc).removeprefix(f"{exc.server}: ")
        raise TeiUnavailable(f"{said}; teibatch bench measures servers that already run: check the URL, or "
                             "start the server first", server=exc.server, status_code=exc.status_code) from exc
    if info.model_kind != "embedding":
        raise WrongModelKind(f"serves {info.model_id}, a {info.model_kind} model, not an embedding model; bench "
                             "servers launched with an embedding model", server=client.url)
    return info


def _requests(texts: list[str], tokens: list[int], batch_size: int,
              payload_limit: int) -> list[tuple[EmbedRequest, int]]:
    """The texts as full requests of ``batch_size`` (the pool repeated to fill the last one), each
    with its tokens."""
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=batch_size, payload_limit=payload_limit)
    needed = math.ceil(max(len(texts), batch_size) / batch_size) * batch_size
    order = [i % len(texts) for i in range(needed)]
    return [(batch.request, sum(tokens[i] for i in batch.positions))
            for batch in packer.pack((i, texts[i]) for i in order)]
