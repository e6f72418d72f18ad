"""Volume export and import over a shell (here the local one), to and from fsspec URLs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pytest

from teibatch.errors import ExportFailed, FleetError
from teibatch.fleet import export
from teibatch.fleet.export import export_volume, read_manifest, seed_volume
from teibatch.fleet.shell import LocalShell


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """An HF-cache-like volume: blobs, a snapshot symlink, a nested file, an empty file."""
    root = tmp_path / "volume"
    blob = root / "models--m" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(os.urandom(100_000))
    snapshot = root / "models--m" / "snapshots" / "main"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/abc")
    (snapshot / "config.json").write_text('{"hidden_size": 384}')
    (root / "empty").write_bytes(b"")
    return root


def test_export_then_import_round_trip(volume: Path, tmp_path: Path) -> None:
    url = str(tmp_path / "exports" / "teibatch-r-0")
    assert export_volume(LocalShell(), str(volume), url, timeout=60, about={"run_id": "r"}) == url
    manifest = json.loads((Path(url) / "_export.json").read_text())
    assert set(manifest["files"]) == {"models--m/blobs/abc", "models--m/snapshots/main/config.json", "empty"}
    assert manifest["links"] == {"models--m/snapshots/main/model.safetensors": "../../blobs/abc"}
    assert manifest["source"]["run_id"] == "r"
    fresh = tmp_path / "fresh"
    # From the folder above: the first export inside it is used.
    assert seed_volume(LocalShell(), str(tmp_path / "exports"), str(fresh), timeout=60) == 3
    link = fresh / "models--m" / "snapshots" / "main" / "model.safetensors"
    assert link.is_symlink() and link.read_bytes() == (volume / "models--m" / "blobs" / "abc").read_bytes()


def test_export_to_any_fsspec_url(volume: Path) -> None:
    export_volume(LocalShell(), str(volume), "memory://exports/v1", timeout=60)
    fs = fsspec.filesystem("memory")
    assert fs.exists("/exports/v1/_export.json")
    _, root, manifest = read_manifest("memory://exports/v1")
    assert len(manifest["files"]) == 3 and root == "/exports/v1"


def test_a_copy_that_does_not_verify_is_not_an_export(volume: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "_digest", lambda fs, path: "0" * 64)
    url = tmp_path / "exports" / "x"
    with pytest.raises(ExportFailed, match="sha256 differs"):
        export_volume(LocalShell(), str(volume), str(url), timeout=60)
    assert not (url / "_export.json").exists()  # no manifest: not an export


def test_missing_volume_is_an_export_failure(tmp_path: Path) -> None:
    with pytest.raises(ExportFailed, match="sha256sum"):
        export_volume(LocalShell(), str(tmp_path / "nope"), str(tmp_path / "out"), timeout=30)


def test_paths_leaving_the_volume_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="leaves the volume"):
        export._relative("../etc/passwd")
    with pytest.raises(FleetError, match="leaves the volume"):
        export._relative("/etc/passwd")
    assert export._relative("./a/b") == "a/b"
    with pytest.raises(FleetError, match="holds no export"):
        read_manifest(str(tmp_path))


def test_an_export_missing_a_file_is_an_import_failure(volume: Path, tmp_path: Path) -> None:
    url = tmp_path / "exports" / "teibatch-r-0"
    export_volume(LocalShell(), str(volume), str(url), timeout=60)
    (url / "data" / "models--m" / "blobs" / "abc").unlink()
    with pytest.raises(FleetError, match=r"local: could not import .*teibatch-r-0 into .*fresh: .*blobs/abc"):
        seed_volume(LocalShell(), str(url), str(tmp_path / "fresh"), timeout=60)
