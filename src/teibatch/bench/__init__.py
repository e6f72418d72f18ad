"""``teibatch bench``: measure running TEI servers over a short grid of client settings, recommend one.

A *setting* is a batch size (inputs a request) and a number of requests kept in flight on each
server; their product is the inputs in flight per server, the job's ``client.max_inflight_inputs``.
The grid (:func:`plan_grid`) stays within every server's ``/info`` limits. Each setting drives all
servers at once through one ``httpx.AsyncClient`` (``POST /embed`` with the :class:`TeiClient`, so
answers are checked as in a run) for a warm-up, then a measuring window (:func:`measure`). The whole
bench stops before ``max_seconds``: a setting that would not finish in time is not started, and what
was measured is reported with the reason it stopped.

A refused key (401), a model that is not an embedding model (424) or a server that refuses
connections makes every setting meaningless: the bench stops with that error. Every other error
(429, 413, 422, other 424s, 5xx, timeouts, dropped connections, wrong answers) is counted by kind.

The modules, each importing only those above it: :mod:`~teibatch.bench.grid` (the settings),
:mod:`~teibatch.bench.texts` (what is sent), :mod:`~teibatch.bench.results` (what a setting
measured), :mod:`~teibatch.bench.measure` (one setting), :mod:`~teibatch.bench.recommend` (what to
set), :mod:`~teibatch.bench.run` (the whole bench), :mod:`~teibatch.bench.chart` (its HTML page).
"""

from __future__ import annotations

from teibatch.bench.chart import render_chart
from teibatch.bench.grid import Setting, plan_grid
from teibatch.bench.measure import setting_seconds
from teibatch.bench.results import SettingResult, error_text
from teibatch.bench.run import BenchReport, BenchSpec, run_bench
from teibatch.bench.texts import TOKENS_FROM_SERVER, bench_texts

__all__ = [
    "TOKENS_FROM_SERVER",
    "BenchReport",
    "BenchSpec",
    "Setting",
    "SettingResult",
    "bench_texts",
    "error_text",
    "plan_grid",
    "render_chart",
    "run_bench",
    "setting_seconds",
]
