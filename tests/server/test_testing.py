"""running_server: thread and subprocess servers start on free ports and always stop."""

from __future__ import annotations

import httpx
import pytest

from teibatch.server.config import FaultConfig, ServerConfig
from teibatch.server.testing import cli_args, running_server, server_stats


def test_thread_server_stops_on_exit() -> None:
    with running_server() as url:
        assert httpx.get(f"{url}/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


def test_thread_server_stops_when_the_test_fails() -> None:
    with pytest.raises(ZeroDivisionError), running_server() as url:
        1 / 0  # noqa: B018
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


def test_two_servers_get_different_ports() -> None:
    with running_server() as first, running_server() as second:
        assert first != second


def test_subprocess_server_takes_the_same_options() -> None:
    with running_server(subprocess=True, api_key="k", max_client_batch_size=3, record_texts=True) as url:
        assert httpx.get(f"{url}/info").status_code == 401
        info = httpx.get(f"{url}/info", headers={"Authorization": "Bearer k"}).json()
        assert info["max_client_batch_size"] == 3
        assert "texts" in server_stats(url)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


def test_cli_args_reproduce_a_config() -> None:
    config = ServerConfig(auto_truncate=False, prompts=(("q", "query: "),), record_texts=True,
                          faults=FaultConfig(rate_429=0.5))
    assert cli_args(config) == ["--auto-truncate", "false", "--prompt", "q=query: ", "--record-texts",
                                "--fault-rate-429", "0.5"]
