"""``teibatch gpus`` and ``teibatch fleet list|sweep``: thin commands over :mod:`teibatch.fleet`.

Registered by ``teibatch.cli`` (``main.add_command(gpus)``, ``main.add_command(fleet)``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from teibatch.cli_errors import handle_errors
from teibatch.errors import EXIT_INCOMPLETE

if TYPE_CHECKING:
    from teibatch.fleet.ledger import Ledger

_state_dir = click.option("--state-dir", envvar="TEIBATCH_STATE_DIR", type=click.Path(file_okay=False),
                          default=None, help="teibatch's state directory (the ledger is in its ledger/ folder).")


def _ledger(state_dir: str | None) -> Ledger:
    from teibatch.fleet.ledger import Ledger

    return Ledger(Path(state_dir) / "ledger") if state_dir else Ledger()


def _json(data: object) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@handle_errors
def gpus(as_json: bool) -> None:
    """The TEI image for each GPU architecture, and each GPU of the catalog: memory, compute
    capability, image, and whether teibatch launches it (supported, experimental, refused and why).

    \b
    Examples:
      teibatch gpus
      teibatch gpus --json | jq '.gpus[] | select(.status != "refused") | .name'
    """
    from teibatch.fleet.catalog import image_table
    from teibatch.fleet.images import gpu_table

    table = image_table()
    architectures = [{"arch": r.arch, "platform": r.platform, "compute_capability": r.compute_capability,
                      "image": table.image(r) if r.tag else None, "status": r.status,
                      "reason": r.refused or r.note} for r in table.rows]
    cards = gpu_table()
    if as_json:
        _json({"architectures": architectures, "gpus": cards})
        return
    click.echo(f"TEI {table.version} images (compute capability below {table.min_compute_capability} is refused)")
    for a in architectures:
        click.echo(f"  {a['arch']:<15} {a['platform']:<8} {a['compute_capability'] or '-':<5} "
                   f"{a['image'] or 'NOT SUPPORTED':<58} {a['status']}")
    click.echo("\nGPU catalog")
    click.echo(f"  {'name':<24} {'VRAM':>5}  {'cc':<5} {'arch':<15} {'status':<13} image / reason")
    for c in cards:
        click.echo(f"  {c['name']:<24} {c['vram_gb']:>3}GB  {c['compute_capability']:<5} {c['arch'] or '?':<15} "
                   f"{c['status']:<13} {c['image'] or c['reason']}")


@click.group()
def fleet() -> None:
    """Servers that runs launched: list them from the ledger, and destroy what a killed run left.

    \b
    Examples:
      teibatch fleet list
      teibatch fleet sweep --dry-run
      teibatch fleet sweep
    """


@fleet.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--all", "show_all", is_flag=True, help="Also list instances already destroyed.")
@_state_dir
@handle_errors
def list_(as_json: bool, show_all: bool, state_dir: str | None) -> None:
    """List the instances in the ledger that are not destroyed (with --all: every instance), and every
    teibatch instance the GPU clouds your runs used still list (asked through their APIs).

    \b
    Examples:
      teibatch fleet list
      teibatch fleet list --all --json
    """
    from teibatch.fleet.clouds import cloud_entries

    ledger = _ledger(state_dir)
    entries = [e for e in ledger.entries() if show_all or not e.state.settled]
    cloud, problems = cloud_entries(ledger)  # what the GPU clouds' APIs list, by name
    for problem in problems:
        click.secho(f"warning: could not ask {problem}", fg="yellow", err=True)
    if as_json:
        _json([e.to_json() for e in entries] + [{"source": "cloud", **c.to_json()} for c in cloud])
        return
    if not entries and not cloud:
        click.echo("nothing left running" if not show_all else "the ledger is empty")
        return
    for e in entries:
        driver = "driver running" if e.driver_alive else "driver gone"
        click.echo(f"{e.run_id}  {e.provider:<6} {e.instance:<40} {e.host or '-':<28} {e.state.value:<10} "
                   f"{driver}  {e.updated}")
    for c in cloud:
        price = f"${c.price_per_hour:.2f}/h" if c.price_per_hour is not None else ""
        click.echo(f"{c.run_id or '?'}  {c.provider:<6} {c.instance:<40} {c.address or '-':<28} "
                   f"{c.status:<10} in the cloud ({c.cloud_id}, ledger: {c.in_ledger}) {price}")


@fleet.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be swept.")
@click.option("--waive-export", is_flag=True,
              help="Destroy volumes and hosts even when their export is not verified (data is lost).")
@click.option("--run", "run_id", default=None, help="Sweep only this run id.")
@click.option("--force", is_flag=True, help="Sweep runs whose driver still seems to run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_state_dir
@handle_errors
def sweep(dry_run: bool, waive_export: bool, run_id: str | None, force: bool, as_json: bool,
          state_dir: str | None) -> None:
    """Remove the containers, export the volumes, and destroy the hosts of every run the ledger shows
    unfinished whose driver is gone. Safe to run again; exits 1 if something is left.

    \b
    Examples:
      teibatch fleet sweep --dry-run
      teibatch fleet sweep
      teibatch fleet sweep --run 20261130T034555Z-f5a74a --waive-export
    """
    from teibatch.fleet.sweep import sweep as sweep_runs

    results = sweep_runs(_ledger(state_dir), run_id=run_id, dry_run=dry_run, waive_export=waive_export,
                         force=force)
    if as_json:
        _json([r.to_json() for r in results])
    elif not results:
        click.echo("nothing to sweep")
    for r in results if not as_json else []:
        click.echo(f"{r.run_id}: {r.action} ({len(r.instances)} instance(s))" + (f": {r.detail}" if r.detail else ""))
    if any(r.action in ("kept", "failed") for r in results):
        sys.exit(EXIT_INCOMPLETE)
