"""Which cloud cards a job may rent: names, memory, price cap, regions, TEI images, model fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from teibatch.fleet.images import choose_image
from teibatch.fleet.offers import GpuWant, Offer, choose_offers, gpu_info, names_match


def offer(gpu: str, price: float, vram: int = 24, region: str | None = "r1", key: str | None = None) -> Offer:
    return Offer(cloud="lambda", key=key or gpu, gpu=gpu, vram_gb=vram, price_per_hour=price, region=region)


@pytest.mark.parametrize(("wanted", "gpu", "match"), [
    pytest.param("A10", "A10 (24 GB PCIe)", True, id="a10"),
    pytest.param("A10", "A100 (40 GB SXM4)", False, id="a10-is-not-a100"),
    pytest.param("rtx 4090", "NVIDIA GeForce RTX 4090", True, id="case"),
    pytest.param("4090", "NVIDIA GeForce RTX 4090", True, id="number"),
])
def test_names_match(wanted: str, gpu: str, match: bool) -> None:
    assert names_match(wanted, gpu) is match


def test_choose_offers_filters_and_orders() -> None:
    offers = [offer("A100 (40 GB SXM4)", 1.29, 40), offer("A10 (24 GB PCIe)", 0.75, region="r2"),
              offer("A10 (24 GB PCIe)", 0.75, region="r1"), offer("Tesla V100 (16 GB)", 0.50, 16),
              offer("Mystery X1 (24 GB)", 0.10), offer("H100 (80 GB SXM5)", 2.49, 80)]
    choice = choose_offers(offers, GpuWant(min_vram_gb=20, max_price=2.0, regions=("r1", "r2")),
                           "BAAI/bge-small-en-v1.5")
    # per unit of throughput: $1.29 / 312 TFLOPS (A100) before $0.75 / 125 TFLOPS (A10)
    assert [(o.gpu, o.region) for o in choice.usable] == [("A100 (40 GB SXM4)", "r1"), ("A10 (24 GB PCIe)", "r1"),
                                                         ("A10 (24 GB PCIe)", "r2")]
    reasons = {o.gpu: r for o, r in choice.refused}
    assert reasons["Tesla V100 (16 GB)"] == "less than 20 GB of memory"
    assert "unknown GPU family" in reasons["Mystery X1 (24 GB)"]
    assert reasons["H100 (80 GB SXM5)"] == "over the price cap of $2.00/h"


def test_v100_is_refused_and_big_models_need_memory() -> None:
    choice = choose_offers([offer("Tesla V100 (32 GB)", 0.5, 32)], GpuWant(), None)
    assert not choice.usable and "7.5" in choice.why_none()
    small = choose_offers([offer("Tesla T4 (16 GB)", 0.40, 16)], GpuWant(), "Qwen/Qwen3-Embedding-8B")
    assert not small.usable and "needs about" in small.why_none()


def test_cards_without_a_throughput_figure_come_after_cheapest_first() -> None:
    offers = [offer("RTX A5000", 0.20), offer("RTX A4000", 0.15, 16), offer("RTX 4090", 0.60)]
    choice = choose_offers(offers, GpuWant(), None)
    assert [o.gpu for o in choice.usable] == ["RTX 4090", "RTX A4000", "RTX A5000"]


def test_the_clouds_own_compute_capability_picks_the_image() -> None:
    known = Offer(cloud="vast", key="7", gpu="RTX 4090D", vram_gb=24, price_per_hour=0.3, compute_capability="8.9")
    old = Offer(cloud="vast", key="8", gpu="GTX 1080 Ti", vram_gb=11, price_per_hour=0.1, compute_capability="6.1")
    choice = choose_offers([known, old], GpuWant(), None)
    assert choice.usable == (known,) and "7.5" in choice.why_none()


@pytest.mark.parametrize(("gpu", "image"), [
    pytest.param("NVIDIA RTX PRO 6000 Blackwell Server Edition", "120-1.9", id="rtx-pro-6000"),
    pytest.param("NVIDIA RTX 2000 Ada Generation", "89-1.9", id="rtx-2000-ada"),
    pytest.param("NVIDIA RTX 4000 Ada Generation", "89-1.9", id="rtx-4000-ada"),
    pytest.param("NVIDIA RTX 5000 Ada Generation", "89-1.9", id="rtx-5000-ada"),
    pytest.param("NVIDIA H800", "hopper-1.9", id="h800"),
    pytest.param("NVIDIA H20", "hopper-1.9", id="h20"),
    pytest.param("NVIDIA H200", "hopper-1.9", id="h200-is-not-h20"),
])
def test_the_catalog_knows_the_newer_cards_and_their_image(gpu: str, image: str) -> None:
    choice = choose_offers([offer(gpu, 1.0, 48)], GpuWant(), None)
    assert choice.usable, choice.why_none()
    card = choice.usable[0]
    info = gpu_info(card)
    assert info is not None and choose_image(info, card.platform).image.endswith(f":{image}")


def test_arm_machines_are_refused_before_renting_but_gb10() -> None:
    gh200, gb10 = offer("GH200 (96 GB)", 1.49, 96), offer("NVIDIA GB10", 0.5, 128)
    choice = choose_offers([gh200, gb10, offer("A10 (24 GB PCIe)", 0.75)], GpuWant(), None)
    assert gh200.platform == "aarch64" and gh200 not in choice.usable
    assert gb10 in choice.usable   # TEI's 121-1.9 image is multi-platform
    [(refused, reason)] = choice.refused
    assert refused == gh200 and "no image for platform aarch64" in reason


@pytest.mark.timeout(60)
def test_lambda_gh200_is_never_rented_and_plan_shows_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from teibatch.cli_plan import plan
    from teibatch.fleet.providers.lambdacloud import LambdaApi
    from tests.fleet.conftest import LAMBDA_KEY
    from tests.fleet.fake_lambda import FakeLambda
    from tests.pipeline.test_plan import job_file

    monkeypatch.setenv("LAMBDA_API_KEY", LAMBDA_KEY)
    with FakeLambda(LAMBDA_KEY) as fake:
        monkeypatch.setenv("TEIBATCH_LAMBDA_API_URL", f"{fake.url}/api/v1")
        api = LambdaApi()
        try:
            offers = api.offers()
        finally:
            api.close()
        # gpu_8x_h100_sxm5 lists no specs.gpus: its name says 8 GPUs, so it is no single-card offer
        assert {o.key for o in offers} == {"gpu_1x_a10", "gpu_1x_a100_sxm4", "gpu_1x_v100", "gpu_1x_gh200"}
        choice = choose_offers(offers, GpuWant(), None)
        assert choice.usable and all(o.key != "gpu_1x_gh200" for o in choice.usable)
        job = job_file(tmp_path, servers={"provider": "lambda", "count": 1, "ssh_key_name": "ci-key",
                                          "startup_timeout": 60})
        shown = CliRunner().invoke(plan, [str(job)])
        assert shown.exit_code == 0, shown.output
        assert "refused gpu_1x_gh200@us-east-3: GH200 (96 GB) (compute capability 9.0): TEI 1.9 has no image " \
               "for platform aarch64" in shown.output
