"""``teibatch bench``: measure running TEI servers and recommend the job's client settings.

Registered by ``teibatch.cli`` (``main.add_command(bench)``). The measuring is
:mod:`teibatch.bench`'s; this module reads the options, chooses the servers and texts, prints.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from teibatch.cli_errors import handle_errors
from teibatch.errors import JobSpecError, TeiUnavailable

if TYPE_CHECKING:
    from teibatch.bench import BenchReport, SettingResult
    from teibatch.endpoint import Endpoint
    from teibatch.job import JobSpec

DEFAULT_MAX_SETTINGS = 12
DEFAULT_SECONDS_PER_SETTING = 5.0
DEFAULT_MAX_SECONDS = 120.0
DEFAULT_WORDS = 100.0
DEFAULT_CORPUS_SAMPLE = 1_000
DEFAULT_CHART = "teibatch-bench.html"


@click.command()
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.option("--urls", multiple=True, metavar="URL",
              help="A running TEI server to measure (repeatable); default: the job's static servers.urls.")
@click.option("--api-key-env", metavar="NAME", envvar="TEIBATCH_API_KEY_ENV",
              help="Environment variable holding the servers' API key; default: the job's servers.api_key_env.")
@click.option("--corpus-sample", type=click.IntRange(1, 100_000), metavar="N",
              help=f"Texts sampled from the job's corpus  [default with a job file: {DEFAULT_CORPUS_SAMPLE}]")
@click.option("--words", type=click.FloatRange(1, 10_000), metavar="MEAN",
              help=f"Use synthetic texts of MEAN words on average, in a spread of lengths  [default without a "
                   f"job file: {DEFAULT_WORDS:g}]")
@click.option("--max-settings", type=click.IntRange(1, 100), default=DEFAULT_MAX_SETTINGS, show_default=True,
              help="Settings (batch size × concurrency) measured at most.")
@click.option("--seconds-per-setting", type=click.FloatRange(0.2, 600), default=DEFAULT_SECONDS_PER_SETTING,
              show_default=True, help="Measuring window of each setting, after a warm-up of up to 1 s.")
@click.option("--max-seconds", type=click.FloatRange(1, 86_400), default=DEFAULT_MAX_SECONDS, show_default=True,
              envvar="TEIBATCH_BENCH_MAX_SECONDS",
              help="Run no longer than this: settings that would not finish in time are not started.")
@click.option("--chart", type=click.Path(dir_okay=False), default=DEFAULT_CHART, show_default=True,
              help="Write an HTML page with the throughput chart here.")
@click.option("--no-chart", is_flag=True, help="Write no chart.")
@click.option("--save", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="Write tokens_per_s of one card (for `teibatch plan --bench FILE.json`) and the settings.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout; all else goes to stderr.")
@handle_errors
def bench(job_file: str | None, urls: tuple[str, ...], api_key_env: str | None, corpus_sample: int | None,
          words: float | None, max_settings: int, seconds_per_setting: float, max_seconds: float, chart: str,
          no_chart: bool, save: str | None, as_json: bool) -> None:
    """Measure running TEI servers over a short grid of batch sizes × inputs in flight, and recommend
    the job's client.max_batch_size and client.max_inflight_inputs (and TEI flags where the server is
    the limit). Sends traffic only to the URLs given (or the job's static servers.urls).

    \b
    Examples:
      teibatch bench --urls http://10.0.0.5:8080 --urls http://10.0.0.6:8080
      teibatch bench job.yaml --corpus-sample 2000 --save bench.json
      teibatch plan job.yaml --bench bench.json
      API_KEY_TEI=... teibatch bench --urls https://tei.example.com --api-key-env API_KEY_TEI --json
    """
    started = time.monotonic()
    _check_usage(job_file, urls, corpus_sample, words, seconds_per_setting, max_seconds)
    for path, key in ((None if no_chart else chart, "--chart"), (save, "--save")):
        _check_writable(path, key)
    from teibatch.bench import BenchSpec, bench_texts, render_chart, run_bench
    from teibatch.job import load_job

    job = load_job(job_file) if job_file else None
    endpoints, key_env = _servers(job, urls, api_key_env)
    corpus = job.corpus_options() if job is not None and words is None else None
    texts, source = bench_texts(corpus, corpus_sample or DEFAULT_CORPUS_SAMPLE, words or DEFAULT_WORDS)
    spec = BenchSpec(endpoints=endpoints, texts=tuple(texts), text_source=source, max_settings=max_settings,
                     seconds_per_setting=seconds_per_setting, max_seconds=max_seconds,
                     api_key_env=key_env, payload_limit=_payload_limit(job), started=started)
    click.echo(f"bench: {len(endpoints)} server(s), {source}; up to {max_settings} settings of "
               f"{seconds_per_setting:g} s, {max_seconds:g} s at most", err=True)
    report = run_bench(spec, on_result=_progress)
    for line in _summary(report):
        click.echo(line, err=as_json)
    if not no_chart:
        Path(chart).write_text(render_chart(report), encoding="utf-8")
        click.echo(f"chart: {chart}", err=True)
    if save and report.recommendation:
        Path(save).write_bytes(orjson.dumps(report.save_json(), option=orjson.OPT_INDENT_2) + b"\n")
        click.echo(f"saved: {save} (teibatch plan JOB --bench {save})", err=True)
    if as_json:
        click.echo(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode())
    if report.recommendation is None:
        raise TeiUnavailable("no request was answered within any setting's window (see the errors above)"
                             + ("; nothing saved" if save else ""), server=", ".join(e.url for e in endpoints))


def _check_usage(job_file: str | None, urls: tuple[str, ...], corpus_sample: int | None, words: float | None,
                 seconds_per_setting: float, max_seconds: float) -> None:
    """Usage errors, before any work (exit 2)."""
    from teibatch.bench import setting_seconds

    if not job_file and not urls:
        raise JobSpecError("name the servers to measure: --urls URL (repeatable), or a JOB_FILE with static "
                           "servers.urls", key="--urls")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise JobSpecError(f"{bad[0]!r} is not an http:// or https:// URL", key="--urls")
    if corpus_sample and not job_file:
        raise JobSpecError("samples a job's corpus: give the JOB_FILE, or use --words for synthetic texts",
                           key="--corpus-sample")
    if corpus_sample and words:
        raise JobSpecError("--corpus-sample and --words exclude each other: texts come from the corpus or are "
                           "synthetic", key="--words")
    one = setting_seconds(seconds_per_setting)
    if max_seconds < one:
        raise JobSpecError(f"{max_seconds:g} s is shorter than one setting ({one:g} s with its warm-up): raise it, "
                           "or lower --seconds-per-setting", key="--max-seconds")


def _check_writable(path: str | None, key: str) -> None:
    if path is None:
        return
    folder = Path(path).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise JobSpecError(f"cannot write {path}: {folder} is not a writable folder", key=key)


def _servers(job: JobSpec | None, urls: tuple[str, ...],
             api_key_env: str | None) -> tuple[tuple[Endpoint, ...], str | None]:
    """The servers to measure and the name of the variable holding their key (its value never printed)."""
    from teibatch.endpoint import Endpoint

    key_env = api_key_env or (job.servers.api_key_env if job else None)
    if not urls:
        assert job is not None  # _check_usage: a job file or --urls
        if job.servers.provider != "static":
            raise JobSpecError(f"provider {job.servers.provider} starts or rents its own servers, and teibatch "
                               "bench measures servers that already run: pass --urls of running servers",
                               key="servers.provider")
        urls = tuple(s.url for s in job.servers.urls)
    key = None
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise JobSpecError(f"the environment variable {key_env} is not set; it should hold the servers' API key",
                               key="--api-key-env" if api_key_env else "servers.api_key_env")
    return tuple(Endpoint(u, api_key=key) for u in dict.fromkeys(u.rstrip("/") for u in urls)), key_env


def _payload_limit(job: JobSpec | None) -> int:
    """Request bodies stay under the job's ``client.payload_limit`` and every static server's own."""
    from teibatch.tei.info import DEFAULT_PAYLOAD_LIMIT

    if job is None:
        return DEFAULT_PAYLOAD_LIMIT
    return min([job.client.payload_limit, *(s.payload_limit for s in job.servers.urls if s.payload_limit)])


def _progress(index: int, total: int, result: SettingResult) -> None:
    from teibatch.bench import error_text

    p95 = result.latency_ms["p95"]
    click.echo(f"  [{index + 1}/{total}] {result.setting.label()}: {result.tokens_per_s:,.0f} tokens/s, "
               f"p95 {'-' if p95 is None else f'{p95:,.0f} ms'}, errors {error_text(result.errors)}", err=True)


def _summary(report: BenchReport) -> list[str]:
    """The results table, the recommendation and the TEI flags, as printed."""
    from teibatch.bench import error_text

    chosen = report.recommendation.setting if report.recommendation else None
    best = report.best
    head = (f"{'batch':>5} {'req/server':>10} {'inputs/server':>13} {'docs/s':>9} {'tokens/s':>11} "
            f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  errors")
    lines = [head, "-" * len(head)]
    for r in report.results:
        latency = " ".join("       -" if r.latency_ms[p] is None else f"{r.latency_ms[p]:>8,.0f}"
                           for p in ("p50", "p95", "p99"))
        note = ("  <- recommended" if r.setting == chosen else "") + ("  (best)" if r is best else "")
        lines.append(f"{r.setting.batch_size:>5} {r.setting.requests:>10} {r.setting.inputs_in_flight:>13} "
                     f"{r.documents_per_s:>9,.0f} {r.tokens_per_s:>11,.0f} {latency}  {error_text(r.errors)}{note}")
    lines.append(f"tokens counted by {report.token_source}; {len(report.results)} of {len(report.grid)} settings "
                 f"in {report.seconds:.1f} s")
    if report.stopped_early:
        lines.append(f"stopped early: {report.stopped_early}")
    if report.recommendation:
        rec = report.recommendation
        lines += [f"recommended: {rec.reason}", "  client:", f"    max_batch_size: {rec.setting.batch_size}",
                  f"    max_inflight_inputs: {rec.setting.inputs_in_flight}"]
        lines += [f"TEI flag to try: {f.flag}: {f.reason}" for f in rec.server_flags]
    if report.tokens_per_s is not None:
        lines.append(f"tokens/s of one card at the best setting: {report.tokens_per_s:,.0f} "
                     "(teibatch plan --bench takes it)")
    return lines
