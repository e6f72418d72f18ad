"""The ``teibatch`` command: parse, call one library function, print."""

from __future__ import annotations

import sys

import click
import orjson

from teibatch import __version__
from teibatch.cli_errors import handle_errors
from teibatch.errors import RejectsFound
from teibatch.logs import JsonLogHandler, ReporterLines, log_through, log_to_stderr


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="teibatch")
@click.option("--debug", is_flag=True, envvar="TEIBATCH_DEBUG", help="Show tracebacks and debug logs.")
def main(debug: bool) -> None:
    """Embed a document corpus on Text Embeddings Inference servers, sharded with Ray, into Parquet.

    \b
    Examples:
      teibatch run jobs/quickstart.yaml
      teibatch run nightly.yaml --set output.path=s3://bucket/vectors
      teibatch validate nightly.yaml
      teibatch serve --port 8080
    """
    log_to_stderr(debug)


_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a job file key, e.g. --set corpus.shard_docs=500 (repeatable).")


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@_set_option
@click.option("--ray-address", envvar="RAY_ADDRESS", default=None,
              help="Ray cluster to join ('auto': the one `ray start` runs on this machine). Default: "
                   "RAY_ADDRESS, else a private local Ray started for this run; never one found by chance.")
@click.option("--quiet", "-q", is_flag=True, envvar="TEIBATCH_QUIET",
              help="Print only the summary and errors.")
@click.option("--fail-on-rejects", is_flag=True, envvar="TEIBATCH_FAIL_ON_REJECTS",
              help="Exit 1 when any document was rejected.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the run report (runs/<id>.json) on stdout, however the run ended; all else goes to stderr.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", envvar="TEIBATCH_LOG_FORMAT",
              show_default=True, help="json: one JSON object a line on stderr (time, level, event, run_id, fields).")
@click.option("--metrics-push", metavar="URL", envvar="TEIBATCH_METRICS_PUSH",
              help="Push the run's metrics to this Prometheus Pushgateway during the run and at its end.")
@click.option("--metrics-textfile", metavar="PATH", envvar="TEIBATCH_METRICS_TEXTFILE",
              help="Write the run's metrics to PATH for node-exporter's textfile collector.")
@handle_errors
def run(job_file: str, overrides: tuple[str, ...], ray_address: str | None, quiet: bool, fail_on_rejects: bool,
        as_json: bool, log_format: str, metrics_push: str | None, metrics_textfile: str | None) -> None:
    """Run the job in JOB_FILE; run the same command again to resume a run that stopped.

    \b
    Exit codes: 0 done · 1 not finished (the same command resumes) · 2 job file or options wrong
    · 3 refused by the servers or the output · 4 another run is writing this output.

    \b
    Examples:
      teibatch run jobs/quickstart.yaml
      teibatch run job.yaml --set servers.count=4 --set corpus.shard_docs=2000
      RAY_ADDRESS=ray://head:10001 teibatch run job.yaml
      teibatch run nightly.yaml --log-format json --metrics-push http://127.0.0.1:9091
    """
    from teibatch.job import load_job
    from teibatch.pipeline import reporter_for, run_job
    from teibatch.pipeline.progress import JsonLinesReporter, ReportCapture, Reporter, Reporters
    from teibatch.pipeline.summary import new_run_id

    run_id = click.get_current_context().meta["teibatch.run_id"] = new_run_id()
    shown = reporter_for(sys.stderr, quiet=quiet, log_format=log_format)
    shown.bind(run_id)
    if isinstance(shown, JsonLinesReporter):
        log_through(JsonLogHandler(shown))
    elif not quiet:  # quiet: warnings still go to stderr, without the progress lines
        log_through(ReporterLines(shown))
    job = load_job(job_file, list(overrides))
    capture = ReportCapture()
    listeners: list[Reporter] = [shown, capture]
    if metrics_push or metrics_textfile:
        from teibatch.pipeline.metrics import MetricsReporter

        listeners.append(MetricsReporter(job.name, push_url=metrics_push, textfile=metrics_textfile))
    try:
        summary = run_job(job, ray_address=ray_address, reporter=Reporters(*listeners), run_id=run_id)
    finally:
        if as_json and capture.report is not None:
            click.echo(orjson.dumps(capture.report, option=orjson.OPT_INDENT_2).decode())
    report = summary.to_json()
    docs = report["documents"]
    if not as_json:
        reasons = ", ".join(f"{k}: {v}" for k, v in docs["rejected_by_reason"].items())
        truncated = docs.get("truncated", 0)
        deduplicated = docs.get("deduplicated", 0)
        chunks = report.get("chunking")
        click.echo(f"done: {docs['embedded']:,} documents embedded"
                   + (f" as {chunks['chunks'] - chunks['chunks_reused']:,} chunks "
                      f"({chunks['tokens_embedded']:,} tokens)" if chunks else "")
                   + (f" ({truncated:,} truncated)" if truncated else "")
                   + (f" ({deduplicated:,} deduplicated)" if deduplicated else "")
                   + (f", {docs['skipped_unchanged']:,} unchanged kept" if docs["skipped_unchanged"] else "")
                   + f", {docs['rejected']:,} rejected"
                   + (f" ({reasons})" if reasons else "")
                   + f"; {summary.shards_committed} shards committed, {summary.shards_skipped} already done"
                   + f"; {report['timings'].get('total_s', 0):.1f}s"
                   # the rate is the embedding phase's: said beside its own time, not the whole run's
                   + (f" ({report['timings']['embed_s']:.1f}s embedding, {report['throughput_docs_per_s']:,.0f} docs/s)"
                      if report["throughput_docs_per_s"] else ""))
        if lost := report.get("replacements"):
            replaced = sum(1 for entry in lost if entry["status"] == "replaced")
            click.echo(f"servers: {len(lost)} taken back by the cloud mid-run, {replaced} replaced "
                       "(see the report's replacements)")
        if left_out := report["corpus"]["left_out"]["count"]:
            click.echo(f"corpus: {left_out:,} file(s) left out (see the report's corpus.left_out): "
                       + ", ".join(report["corpus"]["left_out"]["first"]))
        click.echo(f"output: {job.output.path}/vectors  report: {job.output.path}/runs/{summary.run_id}.json")
    if fail_on_rejects and docs["rejected"]:
        raise RejectsFound(f"{docs['rejected']} documents were rejected (see {job.output.path}/rejects)")


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@_set_option
@handle_errors
def validate(job_file: str, overrides: tuple[str, ...]) -> None:
    """Check JOB_FILE and its corpus, and print the job with every default filled in; launches nothing.

    The corpus is opened: the path must match files, and the first records must parse and hold
    the text, id and kept fields the job names (exit 2 otherwise, naming the file and field).
    When the output already holds committed vectors, their ids are checked: an id in more than
    one row exits 3, naming the id and both places (only the id column is read).

    \b
    Example:
      teibatch validate jobs/quickstart.yaml --set servers.count=4
    """
    import yaml

    from teibatch.corpus import probe_corpus
    from teibatch.corpus.overlap import exclusion_note
    from teibatch.job import load_job
    from teibatch.pipeline.fleet_from_job import check_builtin_model
    from teibatch.sink import OutputStore, check_output_ids

    job = load_job(job_file, list(overrides))
    check_builtin_model(job.servers, job.model.id)
    corpus = job.corpus_options()
    probe = probe_corpus(corpus)
    click.echo(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False).rstrip())
    if (note := exclusion_note(corpus)) is not None:
        click.echo(note, err=True)
    click.echo(f"corpus: {probe.summary()}", err=True)
    if probe.left_out.total:  # also in the summary line; this one is for a person scanning for it
        click.echo(f"corpus: {probe.left_out.describe()}", err=True)
    if parts := check_output_ids(OutputStore(job.output.path, job.output.storage_options)):
        click.echo(f"output: {parts} vectors part(s), every id once", err=True)
    click.secho(f"{job_file}: valid", fg="green", err=True)


@main.command()
@click.argument("output")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@handle_errors
def status(output: str, as_json: bool) -> None:
    """Show an output's state: shards committed and pending, vectors, rejects, the last run, committed parts
    that are missing from the output's files, and the run writing it now.

    \b
    Examples:
      teibatch status out/quickstart
      teibatch status s3://bucket/vectors/nightly --json
    """
    from rich.console import Console
    from rich.table import Table

    from teibatch.sink import OutputStore, output_status

    state = output_status(OutputStore(output))
    if as_json:
        click.echo(orjson.dumps(state, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(show_header=False, box=None)
    shards, docs, last = state["shards"], state["documents"], state["last_run"] or {}
    rows = [("output", state["output"]), ("job", state["job"]),
            ("model", f"{state['model_id']} ({state['dimension']} dimensions)"),
            ("shards", f"{shards['committed']} committed, {shards['pending']} pending of {shards['planned']}"
                       + (f" ({shards['stale']} stale: replaced once their files' new shards are committed)"
                          if shards["stale"] else "")),
            ("vectors", f"{docs['vectors']:,}"), ("rejects", f"{docs['rejects']:,}"),
            ("last run", f"{last.get('run_id')} {last.get('status')}" if last else "-")]
    if writing := state["writing"]:
        rows.append(("writing now", f"run {writing['run_id']} (pid {writing['pid']} on {writing['host']}, "
                                    f"heartbeat {writing['heartbeat_at']})"))
    if stale := state["stale_lock"]:
        rows.append(("stale lock", f"run {stale['run_id']} (pid {stale['pid']} on {stale['host']}) is gone; "
                                   "the next run takes its lock over"))
    for problem, names in (("missing", state["parts"]["missing"]), ("wrong size", state["parts"]["wrong_size"])):
        if names:
            rows.append((f"parts {problem}", f"{len(names)}: {', '.join(names[:5])}"
                                             f"{', …' if len(names) > 5 else ''} (the next run embeds them again)"))
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", str(value))
    Console().print(table)


def _register_commands() -> None:
    from teibatch.cli_bench import bench
    from teibatch.cli_fleet import fleet, gpus
    from teibatch.cli_plan import plan
    from teibatch.cli_report import report
    from teibatch.server.cli import serve

    for command in (serve, gpus, fleet, plan, report, bench):
        main.add_command(command)


_register_commands()
