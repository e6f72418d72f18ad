"""The data the fleet reads from ``configs/``: TEI images per architecture, GPU cards, model sizes.

The YAML files live in the repository's top-level ``configs/``; ``teibatch/fleet/configs`` links to
that folder, so a checkout, an editable install and a wheel (package data) all read the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from teibatch.errors import FleetError

_REPO_CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@dataclass(frozen=True)
class ImageRow:
    """One row of TEI's architecture table."""

    arch: str
    platform: str                    # x86_64 | aarch64 | multi
    compute_capability: str | None   # None for CPU rows
    tag: str | None                  # None for refused rows
    experimental: bool = False
    refused: str | None = None       # why teibatch never launches this row
    note: str | None = None
    entrypoint: str | None = None    # the image's own entrypoint, when not the table's

    @property
    def status(self) -> str:
        return "refused" if self.refused else "experimental" if self.experimental else "supported"


@dataclass(frozen=True)
class ImageTable:
    registry: str
    version: str
    entrypoint: str                  # the entrypoint of TEI's CUDA images (rows may name their own)
    min_compute_capability: str
    rows: tuple[ImageRow, ...]

    def image(self, row: ImageRow) -> str:
        """The full image reference of a row (``registry:tag``)."""
        return f"{self.registry}:{row.tag}"


@dataclass(frozen=True)
class GpuCard:
    """A card of the GPU catalog."""

    name: str
    vram_gb: int
    compute_capability: str


@dataclass(frozen=True)
class ModelSize:
    id: str
    parameters: int
    dimension: int
    max_tokens: int


@dataclass(frozen=True)
class FitRule:
    """How much GPU memory a model needs: ``parameters × bytes × overhead + reserve``."""

    bytes_per_parameter: float
    overhead_factor: float
    reserve_gib: float

    def needed_mib(self, model: ModelSize) -> int:
        weights = model.parameters * self.bytes_per_parameter * self.overhead_factor
        return int(weights / 2**20 + self.reserve_gib * 1024)


def config_dir() -> Path:
    """Where the config files are: package data when installed, else the checkout's ``configs/``."""
    packaged = Path(str(resources.files("teibatch.fleet") / "configs"))
    return packaged if (packaged / "images.yaml").is_file() else _REPO_CONFIGS


def _load(name: str) -> dict[str, Any]:
    path = config_dir() / name
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise FleetError(f"{path}: expected a mapping; this file ships with teibatch: reinstall it")
    return data


@cache
def image_table() -> ImageTable:
    data = _load("images.yaml")
    rows = tuple(
        ImageRow(arch=r["arch"], platform=r.get("platform", "x86_64"),
                 compute_capability=r.get("compute_capability"), tag=r.get("tag"),
                 experimental=bool(r.get("experimental", False)), refused=r.get("refused"), note=r.get("note"),
                 entrypoint=r.get("entrypoint"))
        for r in data["architectures"])
    return ImageTable(registry=data["registry"], version=str(data["version"]), entrypoint=data["entrypoint"],
                      min_compute_capability=str(data["min_compute_capability"]), rows=rows)


@cache
def gpu_catalog() -> tuple[GpuCard, ...]:
    return tuple(GpuCard(name=g["name"], vram_gb=int(g["vram_gb"]), compute_capability=str(g["compute_capability"]))
                 for g in _load("gpus.yaml")["gpus"])


@cache
def model_sizes() -> dict[str, ModelSize]:
    return {m["id"]: ModelSize(id=m["id"], parameters=int(m["parameters"]), dimension=int(m["dimension"]),
                               max_tokens=int(m["max_tokens"]))
            for m in _load("models.yaml")["models"]}


@cache
def fit_rule() -> FitRule:
    fit = _load("models.yaml")["fit"]
    return FitRule(bytes_per_parameter=float(fit["bytes_per_parameter"]),
                   overhead_factor=float(fit["overhead_factor"]), reserve_gib=float(fit["reserve_gib"]))


@dataclass(frozen=True)
class CloudCard:
    """A GPU family the clouds rent, recognised by ``pattern`` in a cloud's GPU name."""

    pattern: str
    name: str
    compute_capability: str
    fp16_tflops: float | None = None
    platform: str = "x86_64"        # the machines' CPU architecture (`uname -m`): aarch64 for Grace superchips


@dataclass(frozen=True)
class BillingRule:
    """How a cloud rounds rented time: up to whole ``increment_s``, at least ``minimum_s``, per instance."""

    increment_s: int
    minimum_s: int
    source: str = ""

    def billed_seconds(self, seconds: float) -> int:
        """The seconds billed for an instance that ran ``seconds``."""
        if seconds <= 0:
            return 0
        increments = -(-round(seconds * 1000) // (self.increment_s * 1000))  # ceil, without float slop
        return max(self.minimum_s, increments * self.increment_s)


@dataclass(frozen=True)
class ThroughputRule:
    """The plan's estimate of tokens/s per card from the card's FP16 TFLOPS and the model's parameters."""

    efficiency: float
    flops_per_token_per_parameter: float
    source: str

    def tokens_per_s(self, fp16_tflops: float, parameters: int) -> float:
        return self.efficiency * fp16_tflops * 1e12 / (self.flops_per_token_per_parameter * parameters)


@cache
def cloud_cards() -> tuple[CloudCard, ...]:
    return tuple(CloudCard(pattern=c["pattern"], name=c["name"], compute_capability=str(c["compute_capability"]),
                           fp16_tflops=c.get("fp16_tflops"), platform=str(c.get("platform", "x86_64")))
                 for c in _load("clouds.yaml")["cards"])


@cache
def billing_rules() -> dict[str, BillingRule]:
    return {name: BillingRule(int(rule["increment_s"]), int(rule["minimum_s"]), str(rule.get("source", "")))
            for name, rule in _load("clouds.yaml")["billing"].items()}


@cache
def throughput_rule() -> ThroughputRule:
    rule = _load("clouds.yaml")["throughput"]
    return ThroughputRule(float(rule["efficiency"]), float(rule["flops_per_token_per_parameter"]), str(rule["source"]))
