"""running_server: thread and subprocess servers start on free ports and always stop."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from teibatch.server import text_digest
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


def test_on_stopped_gets_the_final_stats_with_answers_given_while_stopping() -> None:
    finals: list[dict[str, object]] = []
    answers: list[httpx.Response] = []
    with running_server(record_texts=True, simulate_gpu=1000.0, batch_overhead_s=0.5,
                        on_stopped=finals.append) as url:
        sender = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{url}/embed", json={"inputs": ["late"]}, timeout=10)))
        sender.start()
        deadline = time.monotonic() + 5
        while server_stats(url)["inflight_inputs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server_stats(url)["inputs_embedded"] == 0  # still computing when the stop begins
    sender.join(10)
    assert [a.status_code for a in answers] == [200]
    assert len(finals) == 1 and finals[0]["inputs_embedded"] == 1 and finals[0]["texts"] == {text_digest("late"): 1}


def test_on_stopped_needs_a_thread_server() -> None:
    with pytest.raises(ValueError, match="subprocess=False"), running_server(subprocess=True, on_stopped=print):
        pass
