"""The job file keys of provider ssh and of ``export``, and the provider built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from teibatch.errors import JobSpecError
from teibatch.fleet import LocalDockerProvider, LocalProvider, SshProvider, read_inventory
from teibatch.job import load_job
from teibatch.pipeline.run_fleet import job_provider


def job(tmp_path: Path, servers: dict, **sections: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"corpus": {"path": "x.jsonl"}, "output": {"path": str(tmp_path / "out")},
                                    "model": {"id": "BAAI/bge-small-en-v1.5"}, "servers": servers, **sections}))
    return path


def test_hosts_inline_and_from_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{"address": "10.0.0.2", "user": "ubuntu", "gpu_index": 1,
                                                    "destroy_command": "gpucloud destroy $TEIBATCH_HOST"}]}))
    servers = {"provider": "ssh", "inventory": str(inventory), "image": "my/tei:1", "volume": "/data/tei",
               "hosts": [{"address": "10.0.0.1", "port": 2222, "key_file": "~/.ssh/gpu", "jump_host": "bastion"}]}
    spec = load_job(job(tmp_path, servers, export={"to": "s3://bucket/volumes", "timeout": "30m"}))
    assert spec.export.to == "s3://bucket/volumes" and spec.export.timeout == 1800
    provider = job_provider(spec)
    assert isinstance(provider, SshProvider)
    assert [p.shell.label for p in provider.hosts] == ["10.0.0.1:2222", "ubuntu@10.0.0.2:22"]
    assert provider.hosts[1].gpu_index == 1 and provider.hosts[1].destroy_command
    assert provider.hosted.image == "my/tei:1" and provider.hosted.volume == "/data/tei"
    assert provider.hosted.startup_timeout == 900  # containers pull images and models: 15 minutes unless set


@pytest.mark.parametrize("servers, sections, key, message", [
    pytest.param({"provider": "ssh"}, {}, "servers", "needs servers.hosts", id="no-hosts"),
    pytest.param({"provider": "ssh", "hosts": [{"address": "x", "adress": "x"}]}, {}, "servers.hosts.0.adress",
                 "unknown key",
                 id="misspelled-host-key"),
    pytest.param({"provider": "ssh", "hosts": [{"address": "x", "host_key_checking": "no"}]}, {},
                 "servers.hosts.0.host_key_checking", "'yes' or 'accept-new'", id="no-host-key-checking-refused"),
    pytest.param({"provider": "local", "hosts": [{"address": "x"}]}, {}, "servers", "for provider ssh",
                 id="hosts-without-ssh"),
    pytest.param({"provider": "ssh", "hosts": [{"address": "x"}]}, {"export": {"too": "s3://b"}}, "export.too",
                 "unknown key", id="misspelled-export-key"),
])
def test_job_file_errors_name_the_key(tmp_path: Path, servers: dict, sections: dict, key: str, message: str) -> None:
    with pytest.raises(JobSpecError, match=message) as caught:
        load_job(job(tmp_path, servers, **sections))
    assert caught.value.key == key


def test_destroying_without_export_or_waiver_is_refused(tmp_path: Path) -> None:
    servers = {"provider": "ssh", "hosts": [{"address": "x", "destroy_command": "cloud rm x"}]}
    with pytest.raises(JobSpecError, match=r"export\.to, or export\.waive") as caught:
        job_provider(load_job(job(tmp_path, servers)))
    assert caught.value.key == "export"
    assert job_provider(load_job(job(tmp_path, servers, export={"waive": True})))


def test_bad_inventory_names_the_host_key(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump([{"address": "a"}, {"address": "b", "prot": 22}]))
    with pytest.raises(JobSpecError, match=r"hosts\.1\.prot") as caught:
        job_provider(load_job(job(tmp_path, {"provider": "ssh", "inventory": str(inventory)})))
    assert caught.value.key == "servers.inventory"
    with pytest.raises(JobSpecError, match="cannot read the inventory"):
        job_provider(load_job(job(tmp_path, {"provider": "ssh", "inventory": str(tmp_path / "missing.yaml")})))
    inventory.write_text("just a string")
    with pytest.raises(JobSpecError, match="expected a list of hosts") as caught:
        read_inventory(inventory)  # the fleet's own reader raises the job error too, not a ValueError
    assert caught.value.key == "servers.inventory"


def test_local_engine_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker at all
    builtin = job_provider(load_job(job(tmp_path, {"provider": "local"}, model={"id": "teibatch/hashing-384"})))
    assert isinstance(builtin, LocalProvider)
    with pytest.raises(JobSpecError, match="not a model the built-in servers can run"):  # no Docker: no TEI for it
        job_provider(load_job(job(tmp_path, {"provider": "local"})))
    forced = job_provider(load_job(job(tmp_path, {"provider": "local", "engine": "docker", "count": 1})))
    assert isinstance(forced, LocalDockerProvider) and forced.hosted.gpu is False
