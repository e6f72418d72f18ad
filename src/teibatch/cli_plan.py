"""``teibatch plan``: what a job will embed and, on a GPU cloud, what it will cost; rents nothing.

Registered by ``teibatch.cli`` (``main.add_command(plan)``).
"""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from teibatch.cli_errors import handle_errors
from teibatch.errors import JobSpecError


def _bench(value: str | None) -> float | None:
    """``--bench``: tokens/s of one card, as a number or a JSON file holding ``tokens_per_s``."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        data = orjson.loads(Path(value).read_bytes())
        return float(data["tokens_per_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JobSpecError(f"--bench {value}: expected tokens/s of one card, or a JSON file with "
                           f"'tokens_per_s' ({exc})") from None


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a job file key, e.g. --set servers.count=8 (repeatable).")
@click.option("--bench", default=None, metavar="TOKENS_PER_S|FILE",
              help="Measured tokens/s of one card (a number, or a JSON file with tokens_per_s); "
                   "default: the figures in configs/clouds.yaml.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def plan(job_file: str, overrides: tuple[str, ...], bench: str | None, as_json: bool) -> None:
    """Plan JOB_FILE without running it: shards, documents, tokens, and for a GPU cloud the cards it may
    rent with today's prices, throughput, GPU-hours and cost (rounded up by the cloud's billing rule).

    \b
    Examples:
      teibatch plan job.yaml
      teibatch plan job.yaml --set servers.count=8 --bench 250000
      teibatch plan job.yaml --json | jq .cost
    """
    from teibatch.job import load_job
    from teibatch.pipeline.plan import check_cost_limit, estimate_run

    job = load_job(job_file, list(overrides))
    estimate = estimate_run(job, bench_tokens_per_s=_bench(bench))
    if as_json:
        click.echo(orjson.dumps(estimate.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        chunks = f"about {estimate.chunks:,} chunks, " if estimate.chunks is not None else ""
        click.echo(f"{estimate.shards:,} shards, {estimate.documents:,} documents, {chunks}about {estimate.tokens:,} "
                   f"tokens ({estimate.token_source})")
        if not estimate.rents:
            click.echo(f"provider {estimate.provider}: nothing rented, no cost")
        else:
            billing = estimate.billing
            assert billing is not None
            click.echo(f"provider {estimate.provider}, {estimate.count} card(s); startup {estimate.startup_s:.0f}s "
                       f"per card; billed per {billing.increment_s}s, at least {billing.minimum_s}s ({billing.source})")
            for card in estimate.cards:
                o = card.offer
                where = f" {o.region}" if o.region else ""
                if card.cost is None:
                    click.echo(f"  {o.gpu:<28} {o.key}{where}  ${o.price_per_hour:.2f}/h  {card.throughput_source}")
                    continue
                assert card.tokens_per_s is not None and card.gpu_hours is not None
                click.echo(f"  {o.gpu:<28} {o.key}{where}  ${o.price_per_hour:.2f}/h  "
                           f"{card.tokens_per_s:,.0f} tokens/s  {card.gpu_hours:.2f} GPU-h  ${card.cost:.2f}")
            if estimate.cards:
                click.echo(f"throughput: {estimate.cards[0].throughput_source}")
            for label, reason in estimate.refused:
                click.echo(f"  refused {label}: {reason}")
            cost = estimate.cost
            click.echo(f"cost: ${cost:.2f} (the cheapest card)" if cost is not None else "cost: unknown")
    check_cost_limit(job, estimate)
