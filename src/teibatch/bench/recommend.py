"""What a bench recommends: the smallest client setting near the best throughput, and the TEI flags
to try where the server, not the client, is the limit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from teibatch.bench.grid import Setting
from teibatch.bench.results import SettingResult, error_counts, latency_text

if TYPE_CHECKING:
    from teibatch.tei import ServerInfo

NEAR_BEST = 0.05
"""A setting within this share of the best throughput counts as as good (runs move by a few %)."""
FLAT = 0.05
LATENCY_GROWTH = 1.5
"""Throughput that grows less than ``FLAT`` while p50 latency grows ``LATENCY_GROWTH``-fold: saturated."""


@dataclass(frozen=True)
class ServerFlag:
    """A TEI launch flag to try, and the measurement that suggests it."""

    flag: str
    reason: str


@dataclass(frozen=True)
class Recommendation:
    """The client settings for the job, their throughput, and what the servers themselves limit."""

    setting: Setting
    tokens_per_s: float
    share_of_best: float
    reason: str
    server_flags: tuple[ServerFlag, ...]

    def to_json(self) -> dict[str, Any]:
        """The recommendation as the ``--json`` output writes it, with the job's ``client`` keys to set."""
        return {"client": {"max_batch_size": self.setting.batch_size,
                           "max_inflight_inputs": self.setting.inputs_in_flight},
                "setting": self.setting.to_json(), "tokens_per_s": round(self.tokens_per_s, 1),
                "share_of_best": round(self.share_of_best, 3), "reason": self.reason,
                "server_flags": [{"flag": f.flag, "reason": f.reason} for f in self.server_flags]}


def recommend(results: Sequence[SettingResult], infos: Sequence[ServerInfo]) -> Recommendation | None:
    """The smallest setting (fewest inputs in flight, then lowest p95) within ``NEAR_BEST`` of the
    best throughput, preferring settings without errors; and the TEI flags the measurements point
    to (:func:`server_flags`). ``None`` when no setting got an answer."""
    measured = [r for r in results if r.tokens]
    if not measured:
        return None
    best = max(measured, key=lambda r: r.tokens_per_s)
    near = [r for r in measured if r.tokens_per_s >= (1 - NEAR_BEST) * best.tokens_per_s]
    chosen = min([r for r in near if not r.errors] or near,
                 key=lambda r: (r.setting.inputs_in_flight, r.latency_ms["p95"] or math.inf, r.setting))
    share = chosen.tokens_per_s / best.tokens_per_s
    if chosen is best:
        reason = (f"{chosen.setting.label()}: the most throughput measured ({chosen.tokens_per_s:,.0f} tokens/s); "
                  f"no smaller setting came within {NEAR_BEST:.0%} of it")
    else:
        reason = (f"{chosen.setting.label()}: {chosen.tokens_per_s:,.0f} tokens/s, {share:.0%} of the best "
                  f"({best.setting.label()}: {best.tokens_per_s:,.0f}), with p95 latency "
                  f"{latency_text(chosen.latency_ms['p95'])} against {latency_text(best.latency_ms['p95'])}")
    return Recommendation(chosen.setting, chosen.tokens_per_s, share, reason,
                          tuple(server_flags(results, best, infos)))


def server_flags(results: Sequence[SettingResult], best: SettingResult,
                 infos: Sequence[ServerInfo]) -> list[ServerFlag]:
    """TEI flags to try where the server, not the client, is the limit, each with its measurement."""
    max_batch = min(i.max_client_batch_size for i in infos)
    max_inflight = min(i.max_concurrent_requests for i in infos)
    batch_tokens = min((i.max_batch_tokens or 0) for i in infos) or "unknown"
    flags: dict[str, str] = {}
    line = sorted((r for r in results if r.setting.batch_size == best.setting.batch_size and r.tokens),
                  key=lambda r: r.setting.requests)
    if len(line) >= 2:
        low, top = line[-2], line[-1]
        gain = top.tokens_per_s / low.tokens_per_s - 1
        before, after = low.latency_ms["p50"] or 0.0, top.latency_ms["p50"] or 0.0
        span = f"from {low.setting.inputs_in_flight} to {top.setting.inputs_in_flight} inputs in flight"
        if gain < FLAT and after > LATENCY_GROWTH * before:
            flags["--max-batch-tokens"] = (
                f"throughput flat {span} ({gain:+.0%}) while p50 latency rose {before:.0f} → {after:.0f} ms: the "
                f"server is saturated; with GPU memory to spare a larger --max-batch-tokens (now {batch_tokens}) "
                "lets it batch more a forward pass, else more servers add throughput")
        elif gain >= FLAT and top is best and 2 * top.setting.inputs_in_flight > max_inflight:
            flags["--max-concurrent-requests"] = (
                f"throughput still rising at the server's limit ({span}: {gain:+.0%}); raise "
                f"--max-concurrent-requests (now {max_inflight}) and bench again")
    smaller = [r.tokens_per_s for r in results if r.setting.batch_size < best.setting.batch_size and r.tokens]
    if best.setting.batch_size == max_batch and smaller and best.tokens_per_s > (1 + FLAT) * max(smaller):
        flags["--max-client-batch-size"] = (
            f"the largest batch the server allows ({max_batch}) gave {best.tokens_per_s / max(smaller) - 1:+.0%} "
            f"more throughput than any smaller batch; raise --max-client-batch-size so a request carries more inputs")
    errors = error_counts(results)
    if errors["429"]:
        worst = max(r.setting.inputs_in_flight for r in results if r.errors.get("429"))
        flags.setdefault("--max-concurrent-requests", (
            f"{errors['429']} requests answered 429 (overloaded) at up to {worst} inputs in flight, within /info's "
            f"{max_inflight}: other clients share the servers; raise --max-concurrent-requests, or set "
            "client.max_inflight_inputs lower"))
    if errors["413"]:
        flags["--payload-limit"] = (f"{errors['413']} requests answered 413 (body over the payload limit): raise "
                                    "--payload-limit, or lower client.payload_limit or client.max_batch_size")
    if errors["422"]:
        flags.setdefault("--max-client-batch-size", (
            f"{errors['422']} requests answered 422 (a batch or an input over the server's limits): check "
            "--max-client-batch-size, and that truncation is on (--auto-truncate, model.truncate)"))
    return [ServerFlag(flag, reason) for flag, reason in flags.items()]
