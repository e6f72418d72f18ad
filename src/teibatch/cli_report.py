"""``teibatch report``: one self-contained HTML page for a run, drawn from its ``runs/<id>.json``.

Registered by ``teibatch.cli`` (``main.add_command(report)``).
"""

from __future__ import annotations

from pathlib import Path

import click

from teibatch.cli_errors import handle_errors
from teibatch.errors import JobSpecError


@click.command()
@click.argument("output")
@click.option("--run", "run_id", default=None, metavar="ID",
              help="The run to show: its id, the name of OUTPUT/runs/ID.json. Default: the latest run that "
                   "committed shards or failed (a run that found nothing to do is passed over), else the latest.")
@click.option("-o", "--out", "out_file", default=None, metavar="FILE",
              type=click.Path(dir_okay=False, writable=True),
              help="Write the page to this local file instead of OUTPUT/runs/ID.html.")
@handle_errors
def report(output: str, run_id: str | None, out_file: str | None) -> None:
    """Draw a run of OUTPUT as one HTML page: headline numbers, documents over time, throughput and
    latency per server, rejects by reason with examples, the timeline of events, errors.

    The page is one file that works offline (no script, no font, nothing fetched). By default it is
    written next to the run's JSON report, as OUTPUT/runs/ID.html.

    \b
    Examples:
      teibatch report out/quickstart
      teibatch report s3://bucket/vectors/nightly --run 20250101T020000Z-a1b2c3
      teibatch report out/quickstart -o run.html
    """
    from teibatch.htmlreport import render_report, save_page
    from teibatch.sink import OutputStore, choose_run

    store = OutputStore(output)
    chosen = choose_run(store) if run_id is None else None
    shown, page = render_report(store, chosen.run_id if chosen is not None else run_id)
    if out_file is None:
        where = save_page(store, shown, page)
    else:
        try:
            Path(out_file).write_text(page, encoding="utf-8")
        except OSError as exc:
            raise JobSpecError(f"cannot write the page to {out_file}: {exc.strerror or exc}; "
                               "choose a writable file", key="-o") from exc
        where = out_file
    click.echo(f"report of run {shown}{f' ({chosen.why})' if chosen is not None else ''}: {where}")
