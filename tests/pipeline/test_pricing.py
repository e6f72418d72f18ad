"""``teibatch plan`` per card and capacity, on a fixed price list: two offers of the fake Vast.ai.

The price list (per card-hour): RTX 4090 on-demand $0.69, spot $0.35 (its minimum bid, $0.318, plus
the 10 % margin); RTX A6000 on-demand $0.76, spot $0.39. The job: 480 tokens (40 documents of 12),
``servers.count: 2``, a startup budget of 60 s, billed per second, and measured throughputs (``--bench``) of
2 tokens/s for the RTX 4090 and 4 for the RTX A6000, so that the time per card is minutes, not the
minimum:

| card, cards | time per card | billed | GPU-hours |
|---|---|---|---|
| RTX 4090 × 2 | 480 ÷ (2 × 2) + 60 = 180 s | 180 s | 0.100 |
| RTX 4090 × 1 | 480 ÷ 2 + 60 = 300 s | 300 s | 0.083 |
| RTX A6000 × 2 | 480 ÷ (4 × 2) + 60 = 120 s | 120 s | 0.067 |
| RTX A6000 × 1 | 480 ÷ 4 + 60 = 180 s | 180 s | 0.050 |
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli_plan import plan
from teibatch.errors import JobSpecError
from teibatch.fleet.catalog import BillingRule
from teibatch.fleet.offers import Offer
from teibatch.job import JobSpec, load_job
from teibatch.pipeline.plan import check_cost_limit, estimate_run
from teibatch.pipeline.pricing import (
    BenchFigures,
    card_estimate,
    cheapest_combination,
    check_max_cost,
    price_cards,
    pricing_lines,
)
from tests.fleet.cloudspec import load_spec
from tests.fleet.fake_vast import SPEC_FILE, FakeVast, _offer
from tests.pipeline.test_plan import A10, job_file

KEY = "pricing-test-key-" + "2" * 20
SCHEMA = Path(__file__).parents[2] / "docs" / "json" / "plan.schema.json"
BENCH = BenchFigures((("RTX 4090", 2.0, "bench-4090.json"), ("A6000", 4.0, "bench-a6000.json")))
RTX_4090, A6000 = "NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"


@pytest.fixture
def spot_prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVast]:
    """A fake Vast.ai with two offers, on-demand and spot: a cloud that rents both capacities."""
    (tmp_path / "vast").mkdir()
    fake = FakeVast(KEY, tmp_path / "vast", load_spec(SPEC_FILE))
    fake.offers = [_offer(2001, RTX_4090, 24564, 890, 0.69, 0.318), _offer(2002, A6000, 49140, 860, 0.76, 0.3545)]
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("TEIBATCH_VAST_API_URL", fake.api_url)
    with fake:
        yield fake


def spot_job(tmp_path: Path, capacity: str, **limits: Any) -> Path:
    return job_file(tmp_path, servers={"provider": "vast", "count": 2, "gpu": [RTX_4090, A6000],
                                       "startup_timeout": 60, "capacity": capacity}, limits=limits)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("capacity", "run", "run_cost"), [
    pytest.param("on-demand", (RTX_4090, "on-demand"), 0.1 * 0.69, id="on-demand"),
    pytest.param("spot", (RTX_4090, "spot"), 0.1 * 0.35, id="spot"),
    pytest.param("any", (RTX_4090, "spot"), 0.1 * 0.35, id="any-tries-spot-first"),
])
def test_rows_per_card_and_capacity_and_what_the_run_rents(spot_prices: FakeVast, tmp_path: Path, capacity: str,
                                                           run: tuple[str, str], run_cost: float) -> None:
    estimate = estimate_run(load_job(spot_job(tmp_path, capacity)), bench=BENCH)
    rows = {(c.offer.gpu, c.capacity): (c.offer.price_per_hour, c.billed_seconds, c.gpu_hours, c.cost, c.allowed)
            for c in estimate.cards}
    allows = {"on-demand": {"on-demand"}, "spot": {"spot"}, "any": {"on-demand", "spot"}}[capacity]
    assert rows == {
        (RTX_4090, "spot"): (0.35, 180, pytest.approx(0.1), pytest.approx(0.035), "spot" in allows),
        (RTX_4090, "on-demand"): (0.69, 180, pytest.approx(0.1), pytest.approx(0.069), "on-demand" in allows),
        (A6000, "spot"): (0.39, 120, pytest.approx(0.2 / 3), pytest.approx(0.026), "spot" in allows),
        (A6000, "on-demand"): (0.76, 120, pytest.approx(0.2 / 3), pytest.approx(0.76 * 0.2 / 3), "on-demand" in allows),
    }
    assert [c.cost for c in estimate.cards] == sorted(c.cost or 0.0 for c in estimate.cards)  # cheapest first
    chosen = estimate.chosen
    assert chosen is not None and (chosen.offer.gpu, chosen.capacity, chosen.count) == (*run, 2)
    assert estimate.cost == pytest.approx(run_cost)
    # without limits.max_runtime, any time will do: one RTX A6000 on spot, 180 s, 0.05 GPU-h
    best = estimate.pricing.cheapest if estimate.pricing else None
    assert best is not None and (best.offer.gpu, best.capacity, best.count) == (A6000, "spot", 1)
    assert best.cost == pytest.approx(0.05 * 0.39) and best.seconds == pytest.approx(180)
    document = estimate.to_json()
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["run"]["capacity"] == run[1] and document["cheapest"]["count"] == 1
    assert spot_prices.creates == []   # planning rents nothing


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("max_runtime", "cheapest"), [
    pytest.param("3m", (A6000, "spot", 1, 0.05 * 0.39), id="one-card-is-in-time"),
    pytest.param("150s", (A6000, "spot", 2, (0.2 / 3) * 0.39), id="two-cards-to-be-in-time"),
    pytest.param("100s", None, id="none-is-in-time"),
])
def test_the_cheapest_combination_within_max_runtime(spot_prices: FakeVast, tmp_path: Path, max_runtime: str,
                                                     cheapest: tuple[str, str, int, float] | None) -> None:
    estimate = estimate_run(load_job(spot_job(tmp_path, "on-demand", max_runtime=max_runtime)), bench=BENCH)
    assert estimate.pricing is not None
    best = estimate.pricing.cheapest
    if cheapest is None:
        assert best is None
    else:
        assert best is not None and (best.offer.gpu, best.capacity, best.count) == cheapest[:3]
        assert best.cost == pytest.approx(cheapest[3])
    jsonschema.validate(estimate.to_json(), json.loads(SCHEMA.read_text()))


def test_cheapest_combination_prefers_the_faster_of_equal_costs() -> None:
    # 1 card: 30 s → billed 60 s; 2 cards: 15 s each → 2 × 60 s. Per minute, one card is cheaper.
    per_minute = BillingRule(increment_s=60, minimum_s=60)
    row = card_estimate(A10, tokens=3000, count=2, startup_s=0, billing=per_minute, parameters=None,
                        bench_tokens_per_s=100)
    best = cheapest_combination([row], 2, tokens=3000, startup_s=0, billing=per_minute, max_runtime_s=None)
    assert best is not None and best.count == 1
    per_second = BillingRule(increment_s=1, minimum_s=1)  # the same cost either way: the faster wins
    best = cheapest_combination([row], 2, tokens=3000, startup_s=0, billing=per_second, max_runtime_s=None)
    assert best is not None and best.count == 2 and best.seconds == pytest.approx(15)


@pytest.mark.timeout(60)
def test_max_cost_holds_the_capacity_the_run_rents(spot_prices: FakeVast, tmp_path: Path) -> None:
    # limit $0.05: 2 × RTX 4090 on-demand ($0.069) is refused; on spot ($0.035) it is not
    on_demand = load_job(spot_job(tmp_path, "on-demand", max_cost=0.05))
    with pytest.raises(JobSpecError, match=r"about \$0\.07 \(2 × NVIDIA GeForce RTX 4090 on-demand.*\(\$0\.05\)"):
        check_cost_limit(on_demand, estimate_run(on_demand, bench=BENCH))
    for capacity in ("spot", "any"):
        job = load_job(spot_job(tmp_path, capacity, max_cost=0.05))
        check_cost_limit(job, estimate_run(job, bench=BENCH))


@pytest.mark.timeout(60)
def test_plan_command_per_card_and_capacity(spot_prices: FakeVast, tmp_path: Path) -> None:
    job = str(spot_job(tmp_path, "any", max_runtime="150s"))
    bench = ["--bench", "RTX 4090=2", "--bench", "A6000=4"]
    text = CliRunner().invoke(plan, [job, *bench])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    spot = next(line for line in lines if RTX_4090 in line and " spot " in line)
    # $0.035 (as a float a little under it) rounded to the cent
    assert " spot      $  0.35 " in spot and "2 (bench measurement)   3m00s   0.10 $   0.03" in spot
    assert "run: 2 × NVIDIA GeForce RTX 4090 (2001) spot (the offer it tries first): 0.10 GPU-h, $0.03" in text.output
    assert ("cheapest within limits.max_runtime (2m30s): 2 × NVIDIA RTX A6000 (2002) spot: 2m00s per card, $0.03"
            in text.output)
    assert "cost: $0.03 (what the run rents)" in text.output
    one = CliRunner().invoke(plan, [job, "--bench", "RTX 4090=2", "--json"])   # no figure for the A6000
    data = json.loads(one.stdout)
    a6000 = [c for c in data["cards"] if c["gpu"] == A6000]
    assert len(a6000) == 2 and all(c["cost"] is None and "pass --bench" in c["throughput_source"] for c in a6000)
    assert data["cheapest"] is None    # the RTX 4090 takes 180 s, over 150
    slow = CliRunner().invoke(plan, [job, "--bench", "RTX 4090=2"])
    assert "cheapest within limits.max_runtime (2m30s): none" in slow.output


def test_bench_file_figures_name_their_source(tmp_path: Path) -> None:
    from teibatch.cli_plan import _bench

    saved = tmp_path / "bench-4090.json"
    saved.write_text(json.dumps({"tokens_per_s": 2500.5, "measured_at": "2026-12-01T11:10:45+00:00"}))
    figures = _bench((f"RTX 4090={saved}", "1000"))
    assert figures is not None
    rtx_4090 = Offer(cloud="runpod", key=RTX_4090, gpu=RTX_4090, vram_gb=24, price_per_hour=0.69)
    assert figures.for_offer(rtx_4090) == (2500.5, "bench-4090.json, 2026-12-01T11:10:45+00:00")
    assert figures.for_offer(A10) == (1000.0, "--bench")
    row = card_estimate(rtx_4090, tokens=10, count=1, startup_s=0, billing=BillingRule(1, 1), parameters=None,
                        bench_tokens_per_s=2500.5, bench_source="bench-4090.json, 2026-12-01T11:10:45+00:00")
    assert row.throughput_source == "bench measurement (bench-4090.json, 2026-12-01T11:10:45+00:00)"
    assert _bench(("A10=1000",)) == BenchFigures((("A10", 1000.0, "--bench"),))
    with pytest.raises(JobSpecError, match="--bench A10=fast"):
        _bench(("A10=fast",))


def worked_example_job(tmp_path: Path, capacity: str) -> JobSpec:
    spec = {"corpus": {"path": str(tmp_path / "corpus")}, "model": {"id": "BAAI/bge-small-en-v1.5"},
            "servers": {"provider": "vast", "count": 4, "gpu": ["RTX 4090", "A6000"], "capacity": capacity,
                        "startup_timeout": 900},
            "output": {"path": str(tmp_path / "out")}, "export": {"waive": True},
            "limits": {"max_runtime": "25m", "max_cost": 0.50}}
    path = tmp_path / f"{capacity}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_job(path)


def test_the_worked_example_of_the_docs(tmp_path: Path) -> None:
    offers = [Offer("vast", gpu, gpu, vram, price, interruptible=spot)
              for gpu, vram, prices in ((RTX_4090, 24, (0.69, 0.35)), (A6000, 48, (0.76, 0.39)))
              for price, spot in zip(prices, (False, True), strict=True)]
    pricing = price_cards(worked_example_job(tmp_path, "any"), tokens=500_000_000, parameters=33_400_000,
                          offers=offers)
    docs = (Path(__file__).parents[2] / "docs" / "fleet.md").read_text()
    example = docs.split("**A worked example** (tested)", 1)[1].split("```\n", 2)[1]
    assert example.splitlines() == pricing_lines(pricing, "vast", 4)
    cheapest = pricing.cheapest
    assert cheapest is not None and (cheapest.count, cheapest.billed_seconds) == (2, 1305)
    assert cheapest.cost == pytest.approx(2 * 1305 / 3600 * 0.35)
    assert pricing.run is not None and pricing.run.cost == pytest.approx(4 * 1103 / 3600 * 0.35)
    check_max_cost(worked_example_job(tmp_path, "any"), pricing.run)
    on_demand = worked_example_job(tmp_path, "on-demand")
    run = price_cards(on_demand, tokens=500_000_000, parameters=33_400_000, offers=offers).run
    with pytest.raises(JobSpecError, match=r"about \$0\.85 .*on-demand.*over limits\.max_cost \(\$0\.50\)"):
        check_max_cost(on_demand, run)
