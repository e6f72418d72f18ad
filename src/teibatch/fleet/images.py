"""Which TEI image a host gets, whether the model fits its card, and the ``docker run`` that starts it.

Pure functions over the tables in ``configs/`` (see :mod:`teibatch.fleet.catalog`): nothing here
runs a command, so every choice and every command line is unit-tested.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass

from teibatch.errors import GpuUnsupported
from teibatch.fleet.catalog import ImageRow, fit_rule, gpu_catalog, image_table, model_sizes

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = "nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader"
CONTAINER_PORT = 80          # TEI images listen on $PORT=80
KILL_AFTER_S = 30            # the host-side deadline's SIGKILL grace after SIGTERM
RUN_LABEL = "teibatch.run"   # every container carries the run id in this label
MANAGED_LABEL = "teibatch.managed=true"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as ``nvidia-smi`` reports it."""

    name: str
    compute_capability: str
    memory_mib: int


@dataclass(frozen=True)
class ImageChoice:
    """The image a host runs, the table row it came from (``None`` for an override), and the image's own
    entrypoint, which runs under the host-side deadline (never replaced by TEI's router)."""

    image: str
    row: ImageRow | None
    entrypoint: str

    @property
    def experimental(self) -> bool:
        return bool(self.row and self.row.experimental)


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parse the lines of :data:`NVIDIA_SMI_QUERY` (``NVIDIA A100-SXM4-80GB, 8.0, 81920 MiB``).

    Raises :class:`GpuUnsupported` for a line it cannot read (the host is then left out, like one without a GPU).
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.rsplit(",", 2)]
        try:
            name, cc, memory = parts
            _cc(cc)  # validates
            gpus.append(GpuInfo(name=name, compute_capability=cc, memory_mib=int(memory.split()[0])))
        except (ValueError, IndexError):
            raise GpuUnsupported(f"unexpected nvidia-smi line: {line!r}") from None
    return gpus


def choose_image(gpu: GpuInfo | None, platform: str = "x86_64", *, override: str | None = None) -> ImageChoice:
    """The TEI image for ``gpu`` (``None``: the CPU image) on ``platform`` (``uname -m``).

    Raises :class:`GpuUnsupported` for compute capability below 7.5 (even with an override: TEI
    cannot run there), for a capability or platform the table has no image for, and for refused rows.
    """
    table = image_table()
    platform = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform, platform)
    if gpu is not None and _cc(gpu.compute_capability) < _cc(table.min_compute_capability):
        row = next((r for r in table.rows if r.compute_capability == gpu.compute_capability), None)
        reason = row.refused if row and row.refused else (
            f"compute capability {gpu.compute_capability} is below {table.min_compute_capability}, "
            "which TEI does not support")
        raise GpuUnsupported(f"{gpu.name}: {reason}")
    if override:  # an image of TEI's layout: the entrypoint of TEI's images of that kind
        cpu_row = next((r for r in table.rows if r.compute_capability is None and r.entrypoint), None)
        entrypoint = cpu_row.entrypoint if gpu is None and cpu_row is not None else None
        return ImageChoice(override, None, entrypoint or table.entrypoint)
    wanted = None if gpu is None else _cc(gpu.compute_capability)
    rows = [r for r in table.rows
            if (r.compute_capability is None if wanted is None
                else r.compute_capability is not None and _cc(r.compute_capability) == wanted)]
    what = "CPU" if gpu is None else f"{gpu.name} (compute capability {gpu.compute_capability})"
    if not rows:
        raise GpuUnsupported(f"{what}: TEI {table.version} publishes no image for it; set servers.image "
                             "to choose one yourself")
    row = next((r for r in rows if r.platform in (platform, "multi")), None)
    if row is None:
        raise GpuUnsupported(f"{what}: TEI {table.version} has no image for platform {platform} "
                             f"(only {', '.join(sorted({r.platform for r in rows}))})")
    if row.refused or not row.tag:
        raise GpuUnsupported(f"{what}: {row.refused or 'no image'}")
    return ImageChoice(table.image(row), row, row.entrypoint or table.entrypoint)


def check_fits(model_id: str | None, gpu: GpuInfo) -> None:
    """Raise :class:`GpuUnsupported` when a known model needs more memory than ``gpu`` has."""
    model = model_sizes().get(model_id or "")
    if model is None:
        log.warning("%s: model %s is not in configs/models.yaml; not checking that it fits", gpu.name, model_id)
        return
    needed = fit_rule().needed_mib(model)
    if needed > gpu.memory_mib:
        raise GpuUnsupported(f"{gpu.name}: {model.id} needs about {needed} MiB of GPU memory "
                             f"({model.parameters / 1e6:,.0f}M parameters), the card has {gpu.memory_mib} MiB")


@dataclass(frozen=True)
class ContainerSpec:
    """Everything ``docker run`` needs for one TEI server; holds no secret (the key goes in ``$API_KEY``)."""

    name: str
    image: str
    run_id: str
    volume: str
    model_id: str | None = None
    gpus: str | None = "all"            # None: a CPU image
    deadline_s: int | None = None       # host-side deadline: the container stops itself after it
    host_port: int | None = None        # None: Docker picks a free loopback port
    server_args: tuple[str, ...] = ()
    entrypoint: str | None = None       # the image's own (ImageChoice.entrypoint); None: TEI's CUDA images'


def docker_run_args(spec: ContainerSpec) -> list[str]:
    """``docker run -d`` for ``spec``: bound to the host's loopback only, API key from ``$API_KEY``.

    With ``deadline_s``, the image's own entrypoint runs under ``timeout`` (``--entrypoint timeout
    <image> -k 30s <deadline>s /entrypoint.sh …``), so the container stops by itself even when nobody is
    left to stop it, and what the image's entrypoint does first (TEI's CUDA compat libraries on an older
    driver) is still done.
    """
    table = image_table()
    args = ["docker", "run", "-d", "--name", spec.name, "--label", f"{RUN_LABEL}={spec.run_id}",
            "--label", MANAGED_LABEL]
    if spec.gpus:
        args += ["--gpus", spec.gpus]
    args += ["-p", f"127.0.0.1:{spec.host_port or ''}:{CONTAINER_PORT}", "-v", f"{spec.volume}:/data",
             "-e", "API_KEY"]
    if spec.deadline_s:
        args += ["--entrypoint", "timeout", spec.image, "-k", f"{KILL_AFTER_S}s", f"{spec.deadline_s}s",
                 spec.entrypoint or table.entrypoint]
    else:
        args.append(spec.image)
    if spec.model_id:
        args += ["--model-id", spec.model_id]
    return args + list(spec.server_args)


def docker_run_command(spec: ContainerSpec) -> str:
    """:func:`docker_run_args` as one shell command line."""
    return shlex.join(docker_run_args(spec))


def gpu_table(platform: str = "x86_64") -> list[dict[str, object]]:
    """Every card of the GPU catalog with its architecture, image and status (for ``teibatch gpus``)."""
    rows: list[dict[str, object]] = []
    for card in gpu_catalog():
        gpu = GpuInfo(card.name, card.compute_capability, card.vram_gb * 1024)
        entry: dict[str, object] = {"name": card.name, "vram_gb": card.vram_gb,
                                    "compute_capability": card.compute_capability}
        row = next((r for r in image_table().rows if r.compute_capability == card.compute_capability), None)
        entry["arch"] = row.arch if row else None
        try:
            choice = choose_image(gpu, platform)
        except GpuUnsupported as exc:
            entry.update(image=None, status="refused", reason=str(exc).removeprefix(f"{card.name}: "))
        else:
            entry.update(image=choice.image, status="experimental" if choice.experimental else "supported",
                         reason=None)
        rows.append(entry)
    return rows
