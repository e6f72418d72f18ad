"""``teibatch plan``: what a job will embed and, on a GPU cloud, what it will cost; rents nothing.

Registered by ``teibatch.cli`` (``main.add_command(plan)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from teibatch.cli_errors import handle_errors
from teibatch.errors import JobSpecError

if TYPE_CHECKING:
    from teibatch.pipeline.pricing import BenchFigures


def _figure(value: str, given: str) -> tuple[float, str]:
    """One ``--bench`` figure: tokens/s of one card, as a number or a ``teibatch bench --save`` file; and its
    source, as the plan names it."""
    try:
        return float(value), "--bench"
    except ValueError:
        pass
    try:
        data = orjson.loads(Path(value).read_bytes())
        return float(data["tokens_per_s"]), f"{Path(value).name}, {data.get('measured_at') or 'saved'}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JobSpecError(f"--bench {given}: expected tokens/s of one card, or a JSON file with "
                           f"'tokens_per_s' ({exc})") from None


def _bench(values: tuple[str, ...]) -> BenchFigures | None:
    """``--bench [GPU=]TOKENS_PER_S|FILE`` (repeatable): a figure for the cards GPU names, or for every card."""
    from teibatch.pipeline.pricing import BenchFigures

    if not values:
        return None
    figures = []
    for value in values:
        gpu, _, figure = value.partition("=") if "=" in value and not Path(value).exists() else ("", "", value)
        figures.append((gpu.strip(), *_figure(figure, value)))
    return BenchFigures(tuple(figures))


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a job file key, e.g. --set servers.count=8 (repeatable).")
@click.option("--bench", multiple=True, metavar="[GPU=]TOKENS_PER_S|FILE",
              help="Measured tokens/s of one card: a number, or a `teibatch bench --save` file; GPU= for the "
                   "cards that name (repeatable); default: the catalog estimate of configs/clouds.yaml.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def plan(job_file: str, overrides: tuple[str, ...], bench: tuple[str, ...], as_json: bool) -> None:
    """Plan JOB_FILE without running it: shards, documents, tokens, and for a GPU cloud the cards it may
    rent, on-demand and spot, with today's prices, throughput, GPU-hours and cost (rounded up by the
    cloud's billing rule), what the run rents, and the cheapest card, capacity and count that finishes
    within limits.max_runtime.

    \b
    Examples:
      teibatch plan job.yaml
      teibatch plan job.yaml --set servers.count=8 --bench 250000
      teibatch plan job.yaml --bench "RTX 4090=bench-4090.json" --bench "A10=bench-a10.json"
      teibatch plan job.yaml --json | jq .cheapest
    """
    from teibatch.job import load_job
    from teibatch.pipeline.fleet_from_job import check_builtin_model
    from teibatch.pipeline.plan import check_cost_limit, estimate_run
    from teibatch.pipeline.pricing import pricing_lines

    job = load_job(job_file, list(overrides))
    check_builtin_model(job.servers, job.model.id)
    estimate = estimate_run(job, bench=_bench(bench))
    if as_json:
        click.echo(orjson.dumps(estimate.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        if estimate.chunks_range is not None and estimate.tokens_range is not None:  # a range from the sample
            counts = (f"{_range(estimate.chunks_range)} chunks (about {estimate.chunks:,}), "
                      f"{_range(estimate.tokens_range)} tokens (about {estimate.tokens:,}; {estimate.token_source})")
        else:
            counts = f"about {estimate.tokens:,} tokens ({estimate.token_source})"
        click.echo(f"{estimate.shards:,} shards, {estimate.documents:,} documents, {counts}")
        if estimate.left_out.total:
            click.echo(f"corpus: {estimate.left_out.describe()}")
        if not estimate.rents or estimate.pricing is None:
            click.echo(f"provider {estimate.provider}: nothing rented, no cost")
        else:
            for line in pricing_lines(estimate.pricing, estimate.provider, estimate.count):
                click.echo(line)
            cost = estimate.cost
            click.echo(f"cost: ${cost:.2f} (what the run rents)" if cost is not None else "cost: unknown")
    check_cost_limit(job, estimate)


def _range(low_high: tuple[int, int]) -> str:
    """``1,200–1,450``, or one number when the sample was the whole corpus."""
    low, high = low_high
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"
