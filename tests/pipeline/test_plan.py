"""``teibatch plan``: the arithmetic checked against hand computations, billing minimums included."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli_plan import plan
from teibatch.corpus import ApproxTokenCounter, Chunker, ChunkingOptions
from teibatch.errors import JobSpecError
from teibatch.fleet.catalog import BillingRule, throughput_rule
from teibatch.fleet.offers import Offer
from teibatch.job import load_job
from teibatch.pipeline.plan import builtin_tokens, check_cost_limit, estimate_run
from teibatch.pipeline.pricing import card_estimate
from tests.conftest import write_jsonl
from tests.fleet.fake_lambda import FakeLambda

KEY = "plan-test-key-" + "1" * 20
PER_MINUTE = BillingRule(increment_s=60, minimum_s=60)
WHOLE_HOURS = BillingRule(increment_s=3600, minimum_s=3600)
A10 = Offer(cloud="lambda", key="gpu_1x_a10", gpu="A10 (24 GB PCIe)", vram_gb=24, price_per_hour=0.75,
            region="us-east-1")
A100 = Offer(cloud="lambda", key="gpu_1x_a100_sxm4", gpu="A100 (40 GB SXM4)", vram_gb=40, price_per_hour=1.29,
             region="us-east-1")
V100 = Offer(cloud="lambda", key="gpu_1x_v100", gpu="Tesla V100 (16 GB)", vram_gb=16, price_per_hour=0.50,
             region="us-south-1")


@pytest.mark.parametrize(("rule", "seconds", "billed"), [
    pytest.param(PER_MINUTE, 0.5, 60, id="per-minute-minimum"),
    pytest.param(PER_MINUTE, 60, 60, id="per-minute-exact"),
    pytest.param(PER_MINUTE, 60.001, 120, id="per-minute-rounds-up"),
    pytest.param(WHOLE_HOURS, 62.4, 3600, id="hourly-minimum"),
    pytest.param(WHOLE_HOURS, 3601, 7200, id="hourly-rounds-up"),
    pytest.param(PER_MINUTE, 0, 0, id="nothing-run-nothing-billed"),
])
def test_billing_rules(rule: BillingRule, seconds: float, billed: int) -> None:
    assert rule.billed_seconds(seconds) == billed


def test_card_estimate_by_hand() -> None:
    # 480 tokens on 2 cards at 100 tokens/s each: 2.4 s, plus 60 s startup = 62.4 s per card.
    per_minute = card_estimate(A10, tokens=480, count=2, startup_s=60, billing=PER_MINUTE, parameters=None,
                               bench_tokens_per_s=100)
    assert per_minute.seconds == pytest.approx(62.4)
    assert per_minute.billed_seconds == 120                    # two started minutes per card
    assert per_minute.gpu_hours == pytest.approx(240 / 3600)   # 2 cards × 120 s
    assert per_minute.cost == pytest.approx(240 / 3600 * 0.75)  # = $0.05
    hourly = card_estimate(A10, tokens=480, count=2, startup_s=60, billing=WHOLE_HOURS, parameters=None,
                           bench_tokens_per_s=100)
    assert (hourly.billed_seconds, hourly.gpu_hours, hourly.cost) == (3600, 2.0, pytest.approx(1.50))


def test_card_estimate_from_the_configs_names_its_source() -> None:
    # bge-small: 33.4M parameters; A10: 125 dense FP16 TFLOPS; efficiency 0.25; 2 FLOPs per parameter-token.
    estimate = card_estimate(A10, tokens=10**9, count=4, startup_s=900, billing=PER_MINUTE, parameters=33_400_000,
                             bench_tokens_per_s=None)
    expected = 0.25 * 125e12 / (2 * 33_400_000)
    assert estimate.tokens_per_s == pytest.approx(expected)
    assert estimate.throughput_source == f"catalog estimate: {throughput_rule().source}"
    seconds = 10**9 / (expected * 4) + 900
    assert estimate.billed_seconds == -(-int(seconds) // 60) * 60
    unknown = card_estimate(A10, tokens=10, count=1, startup_s=0, billing=PER_MINUTE, parameters=None,
                            bench_tokens_per_s=None)
    assert unknown.cost is None and "--bench" in unknown.throughput_source


def job_file(tmp_path: Path, *, servers: dict[str, Any], limits: dict[str, Any] | None = None,
             **sections: dict[str, Any]) -> Path:
    # 40 documents of exactly 40 characters: the built-in estimate is 40 / 4 + 2 = 12 tokens each.
    rows = [{"id": f"d{i:02d}", "text": f"document {i:02d} " + "x" * 28} for i in range(40)]
    assert all(len(r["text"]) == 40 for r in rows)
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    spec = {"corpus": {"path": str(tmp_path / "corpus"), "shard_docs": 15}, "model": {"id": "teibatch/unknown-model"},
            "servers": servers, "output": {"path": str(tmp_path / "out")}, "export": {"waive": True},
            "limits": limits or {}}
    for section, values in sections.items():
        spec[section] = {**spec.get(section, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


LAMBDA = {"provider": "lambda", "count": 2, "ssh_key_name": "k", "startup_timeout": 60, "gpu": ["A10", "A100"]}


def test_estimate_run_by_hand(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, servers=LAMBDA))
    estimate = estimate_run(job, offers=[A100, A10, V100], bench_tokens_per_s=100)
    assert (estimate.shards, estimate.documents) == (3, 40)         # 15 + 15 + 10
    assert estimate.tokens == 40 * builtin_tokens("x" * 40) == 480
    assert estimate.token_source.startswith("built-in estimate")
    assert [c.offer.key for c in estimate.cards] == ["gpu_1x_a10", "gpu_1x_a100_sxm4"]  # cheapest first
    assert estimate.cards[0].cost == pytest.approx(240 / 3600 * 0.75)
    # the run's estimate is what it rents: the A100 comes first per unit of the catalog's throughput
    assert estimate.chosen is not None and estimate.chosen.offer.key == "gpu_1x_a100_sxm4"
    assert estimate.cost == estimate.cards[1].cost == pytest.approx(240 / 3600 * 1.29)
    assert estimate.refused == (("gpu_1x_v100@us-south-1", "not A10 or A100"),)


def test_a_chunked_plan_counts_the_chunks_and_tokens_the_run_sends(tmp_path: Path) -> None:
    long_rows = [{"id": f"d{i}", "text": " ".join(f"word{j}" for j in range(30 + 50 * i))} for i in range(6)]
    write_jsonl(tmp_path / "long" / "docs.jsonl", long_rows)
    chunking = {"strategy": "tokens", "max_tokens": 40, "overlap_tokens": 8}
    job = load_job(job_file(tmp_path, corpus={"path": str(tmp_path / "long")}, chunking=chunking,
                            model={"id": "teibatch/hashing-384"}, servers={"provider": "local"}))
    estimate = estimate_run(job)
    chunker = Chunker(ChunkingOptions(40, 8), ApproxTokenCounter())
    cut = [chunker.chunk(row["text"]) for row in long_rows]
    assert estimate.chunks == sum(len(c.chunks) for c in cut) > len(long_rows)
    assert estimate.tokens == sum(chunk.tokens for c in cut for chunk in c.chunks)
    assert estimate.token_source == "chunked with builtin-hashing, max_tokens 40"
    assert estimate.to_json()["chunks"] == estimate.chunks
    schema = Path(__file__).parents[2] / "docs" / "json" / "plan.schema.json"
    jsonschema.validate(estimate.to_json(), json.loads(schema.read_text()))

    unknown = load_job(job_file(tmp_path, corpus={"path": str(tmp_path / "long")}, chunking=chunking,
                                model={"id": "acme/not-here"}, servers={"provider": "static", "urls": ["http://x"]}))
    guessed = estimate_run(unknown)
    assert guessed.token_source.startswith("estimate: chunks cut by characters")
    assert guessed.chunks is not None and guessed.chunks > len(long_rows)


def test_local_jobs_rent_nothing_and_cost_nothing(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, servers={"provider": "local"}, limits={"max_cost": 0.01}))
    estimate = estimate_run(job)
    assert (estimate.rents, estimate.cost, estimate.cards) == (False, 0.0, ())
    check_cost_limit(job, estimate)


def test_max_cost(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, servers=LAMBDA, limits={"max_cost": 0.04}))
    estimate = estimate_run(job, offers=[A10], bench_tokens_per_s=100)   # $0.05
    with pytest.raises(JobSpecError, match=r"about \$0\.05.*limits\.max_cost \(\$0\.04\)") as caught:
        check_cost_limit(job, estimate)
    assert caught.value.key == "limits.max_cost"
    check_cost_limit(load_job(job_file(tmp_path, servers=LAMBDA, limits={"max_cost": 0.06})), estimate)
    unknown = estimate_run(job, offers=[A10])  # no bench, and the model's size is not known
    with pytest.raises(JobSpecError, match="cannot be estimated"):
        check_cost_limit(job, unknown)


@pytest.fixture
def lambda_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLambda]:
    fake = FakeLambda(KEY)
    monkeypatch.setenv("LAMBDA_API_KEY", KEY)
    monkeypatch.setenv("TEIBATCH_LAMBDA_API_URL", f"{fake.url}/api/v1")
    with fake:
        yield fake


@pytest.mark.timeout(60)
def test_plan_command_prices_from_the_api(tmp_path: Path, lambda_api: FakeLambda) -> None:
    job = job_file(tmp_path, servers=LAMBDA, limits={"max_cost": 1.0})
    result = CliRunner().invoke(plan, [str(job), "--bench", "100", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["documents"], data["tokens"]) == (40, 480)
    assert data["cards"][0]["cost"] == pytest.approx(240 / 3600 * 0.75)   # the fake lists gpu_1x_a10 at 75 cents/h
    assert data["cost"] == pytest.approx(240 / 3600 * 1.29)   # what the run rents first: gpu_1x_a100_sxm4
    assert data["billing"]["increment_s"] == 60 and "one-minute" in data["billing"]["source"]
    assert [c["key"] for c in data["cards"]] == ["gpu_1x_a10", "gpu_1x_a100_sxm4"]  # 8x types are not offered
    assert lambda_api.creates == []                                  # planning rents nothing
    text = CliRunner().invoke(plan, [str(job), "--bench", "100"])
    assert "40 documents, about 480 tokens" in text.output and "$   0.05" in text.output
    assert "cost: $0.09 (what the run rents)" in text.output
    over = CliRunner().invoke(plan, [str(job), "--bench", "100", "--set", "limits.max_cost=0.01"])
    assert over.exit_code == 2 and "limits.max_cost" in over.output


def test_plan_help_has_examples() -> None:
    result = CliRunner().invoke(plan, ["--help"])
    assert result.exit_code == 0 and "Examples:" in result.output


def ordered_corpus(root: Path) -> list[dict[str, str]]:
    """1,200 documents in three files, short ones first: a.jsonl short, b.jsonl short then long,
    c.jsonl long (of varied length), so the first 500 documents say nothing of the rest."""
    def short(name: str, i: int) -> dict[str, str]:
        return {"id": f"{name}{i}", "text": f"a short note {i}"}

    def long(name: str, i: int) -> dict[str, str]:
        return {"id": f"{name}{i}", "text": " ".join(f"word{j}" for j in range(60 + (i * 37) % 240))}

    files = {"a": [short("a", i) for i in range(400)],
             "b": [short("b", i) for i in range(200)] + [long("b", i) for i in range(200, 400)],
             "c": [long("c", i) for i in range(400)]}
    for name, rows in files.items():
        write_jsonl(root / f"{name}.jsonl", rows)
    return [row for rows in files.values() for row in rows]


def test_a_chunked_plan_prints_a_range_that_holds_the_real_count(tmp_path: Path) -> None:
    rows = ordered_corpus(tmp_path / "ordered")
    chunking = {"strategy": "sentences", "max_tokens": 40, "overlap_tokens": 8}
    job = job_file(tmp_path, corpus={"path": str(tmp_path / "ordered"), "shard_docs": 150}, chunking=chunking,
                   model={"id": "teibatch/hashing-384"}, servers={"provider": "local"})
    result = CliRunner().invoke(plan, [str(job)])
    assert result.exit_code == 0, result.output
    chunker = Chunker(ChunkingOptions(40, 8, "sentences"), ApproxTokenCounter())
    cut = [chunker.chunk(row["text"]) for row in rows]
    real_chunks = sum(len(c.chunks) for c in cut)
    real_tokens = sum(chunk.tokens for c in cut for chunk in c.chunks)
    assert real_chunks > 2 * len(rows)  # the long documents make most of the chunks
    found = re.search(r"([\d,]+)–([\d,]+) chunks \(about ([\d,]+)\), ([\d,]+)–([\d,]+) tokens", result.output)
    assert found, result.output
    low, high, about, tokens_low, tokens_high = (int(group.replace(",", "")) for group in found.groups())
    assert low <= real_chunks <= high, result.output
    assert low <= about <= high and high - low < real_chunks  # a range, not a shrug
    assert tokens_low <= real_tokens <= tokens_high, result.output
    data = json.loads(CliRunner().invoke(plan, [str(job), "--json"]).stdout)
    assert data["chunks_range"] == [low, high] and data["tokens_range"] == [tokens_low, tokens_high]
    schema = Path(__file__).parents[2] / "docs" / "json" / "plan.schema.json"
    jsonschema.validate(data, json.loads(schema.read_text()))
