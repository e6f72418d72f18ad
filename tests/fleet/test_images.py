"""Image choice for every row of TEI's architecture table, refusals, fit checks, docker run lines."""

from __future__ import annotations

import re

import pytest

from teibatch.errors import GpuUnsupported
from teibatch.fleet.catalog import gpu_catalog, image_table
from teibatch.fleet.images import (
    ContainerSpec,
    GpuInfo,
    check_fits,
    choose_image,
    docker_run_args,
    docker_run_command,
    gpu_table,
    parse_nvidia_smi,
)

TEI = "ghcr.io/huggingface/text-embeddings-inference"


def gpu(cc: str, memory_gib: int = 80) -> GpuInfo:
    return GpuInfo(name=f"card {cc}", compute_capability=cc, memory_mib=memory_gib * 1024)


@pytest.mark.parametrize("cc, platform, tag, experimental", [
    pytest.param(None, "x86_64", "cpu-1.9", False, id="cpu-x86_64"),
    pytest.param(None, "aarch64", "cpu-arm64-1.9", False, id="cpu-aarch64"),
    pytest.param(None, "arm64", "cpu-arm64-1.9", False, id="cpu-arm64-alias"),
    pytest.param("7.5", "x86_64", "turing-1.9", True, id="turing"),
    pytest.param("8.0", "x86_64", "1.9", False, id="ampere-8.0"),
    pytest.param("8.6", "x86_64", "86-1.9", False, id="ampere-8.6"),
    pytest.param("8.9", "x86_64", "89-1.9", False, id="ada-lovelace"),
    pytest.param("9.0", "x86_64", "hopper-1.9", False, id="hopper"),
    pytest.param("10.0", "x86_64", "100-1.9", True, id="blackwell-10.0"),
    pytest.param("12.0", "x86_64", "120-1.9", True, id="blackwell-12.0"),
    pytest.param("12.1", "x86_64", "121-1.9", True, id="blackwell-12.1"),
    pytest.param("12.1", "aarch64", "121-1.9", True, id="blackwell-12.1-multi-platform"),
])
def test_every_row_of_the_table(cc: str | None, platform: str, tag: str, experimental: bool) -> None:
    choice = choose_image(None if cc is None else gpu(cc), platform)
    assert choice.image == f"{TEI}:{tag}"
    assert choice.experimental is experimental
    assert choice.row is not None and choice.row.status == ("experimental" if experimental else "supported")


def test_the_table_has_every_architecture_of_the_seed() -> None:
    arches = [(r.arch, r.platform) for r in image_table().rows]
    assert arches == [("CPU", "x86_64"), ("CPU", "aarch64"), ("Volta", "x86_64"), ("Turing", "x86_64"),
                      ("Ampere 8.0", "x86_64"), ("Ampere 8.6", "x86_64"), ("Ada Lovelace", "x86_64"),
                      ("Hopper", "x86_64"), ("Blackwell 10.0", "x86_64"), ("Blackwell 12.0", "x86_64"),
                      ("Blackwell 12.1", "multi")]


@pytest.mark.parametrize("card, platform, override, reason", [
    pytest.param(gpu("7.0"), "x86_64", None, "Volta (compute capability 7.0, V100) is below compute capability 7.5",
                 id="volta"),
    pytest.param(gpu("7.0"), "x86_64", "my/tei:latest", "below compute capability 7.5", id="volta-despite-override"),
    pytest.param(gpu("6.1"), "x86_64", None, "compute capability 6.1 is below 7.5", id="pascal"),
    pytest.param(gpu("8.7"), "x86_64", None, "publishes no image for it", id="no-row"),
    pytest.param(gpu("9.0"), "aarch64", None, "no image for platform aarch64", id="hopper-on-arm"),
])
def test_refusals_name_the_reason(card: GpuInfo, platform: str, override: str | None, reason: str) -> None:
    with pytest.raises(GpuUnsupported, match=re.escape(reason)):
        choose_image(card, platform, override=override)


def test_override_is_used_for_supported_cards() -> None:
    assert choose_image(gpu("8.7"), override="my/tei:orin").image == "my/tei:orin"


def test_catalog_rows_and_statuses() -> None:
    rows = {r["name"]: r for r in gpu_table()}
    assert len(rows) == len(gpu_catalog()) == 29
    assert rows["V100 16G"]["status"] == rows["V100 32G"]["status"] == "refused"
    assert "7.5" in str(rows["V100 32G"]["reason"])
    assert rows["RTX 5090"] == {"name": "RTX 5090", "vram_gb": 32, "compute_capability": "12.0",
                                "arch": "Blackwell 12.0", "image": f"{TEI}:120-1.9", "status": "experimental",
                                "reason": None}
    assert rows["A100 80G"]["image"] == f"{TEI}:1.9"
    assert rows["RTX 2080 Ti"]["status"] == "experimental"
    assert rows["H20-3e 141G"]["vram_gb"] == 141
    assert {r["status"] for r in rows.values()} == {"supported", "experimental", "refused"}


@pytest.mark.parametrize("model, memory_gib, fits", [
    pytest.param("Qwen/Qwen3-Embedding-8B", 8, False, id="8B-on-8GB"),
    pytest.param("Qwen/Qwen3-Embedding-8B", 48, True, id="8B-on-48GB"),
    pytest.param("BAAI/bge-small-en-v1.5", 8, True, id="small-on-8GB"),
    pytest.param("some/unknown-model", 1, True, id="unknown-is-not-checked"),
])
def test_model_fit(model: str, memory_gib: int, fits: bool) -> None:
    if fits:
        check_fits(model, gpu("8.9", memory_gib))
    else:
        with pytest.raises(GpuUnsupported, match="needs about"):
            check_fits(model, gpu("8.9", memory_gib))


def test_parse_nvidia_smi() -> None:
    text = "NVIDIA A100-SXM4-80GB, 8.0, 81920 MiB\nNVIDIA GeForce RTX 4090, 8.9, 24564 MiB\n"
    assert parse_nvidia_smi(text) == [GpuInfo("NVIDIA A100-SXM4-80GB", "8.0", 81920),
                                      GpuInfo("NVIDIA GeForce RTX 4090", "8.9", 24564)]
    for garbage in ("garbage", "NVIDIA A10, eight, 24 GiB", "NVIDIA A10, 8.6, MiB"):
        with pytest.raises(GpuUnsupported, match="unexpected nvidia-smi line"):  # a FleetError: the host is left out
            parse_nvidia_smi(garbage)


def test_gpu_docker_run_line() -> None:
    spec = ContainerSpec(name="teibatch-r1-0", image=f"{TEI}:89-1.9", run_id="r1", volume="/home/u/teibatch-data",
                         model_id="BAAI/bge-small-en-v1.5", deadline_s=7800,
                         server_args=("--max-batch-tokens", "16384"))
    assert docker_run_args(spec) == [
        "docker", "run", "-d", "--name", "teibatch-r1-0", "--label", "teibatch.run=r1",
        "--label", "teibatch.managed=true", "--gpus", "all", "-p", "127.0.0.1::80",
        "-v", "/home/u/teibatch-data:/data", "-e", "API_KEY",
        "--entrypoint", "timeout", f"{TEI}:89-1.9", "-k", "30s", "7800s", "/entrypoint.sh",
        "--model-id", "BAAI/bge-small-en-v1.5", "--max-batch-tokens", "16384"]


def test_local_cpu_image_docker_run_line() -> None:
    """The ``local`` provider's Docker command, built from the same table (no engine runs here)."""
    image = choose_image(None, "x86_64").image
    spec = ContainerSpec(name="teibatch-r2-1", image=image, run_id="r2", volume="/state/volumes/tei",
                         model_id="sentence-transformers/all-MiniLM-L6-v2", gpus=None, host_port=8080)
    assert docker_run_command(spec) == (
        "docker run -d --name teibatch-r2-1 --label teibatch.run=r2 --label teibatch.managed=true "
        f"-p 127.0.0.1:8080:80 -v /state/volumes/tei:/data -e API_KEY {TEI}:cpu-1.9 "
        "--model-id sentence-transformers/all-MiniLM-L6-v2")
