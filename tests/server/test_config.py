"""ServerConfig: TEI's defaults, validation before any socket opens, option helpers."""

from __future__ import annotations

import pytest

from teibatch.server.config import FaultConfig, ServerConfig, config_from_options


def test_defaults_are_tei_defaults() -> None:
    config = ServerConfig()
    assert (config.max_client_batch_size, config.max_concurrent_requests, config.max_batch_tokens,
            config.max_input_length, config.payload_limit, config.auto_truncate, config.api_key) == \
        (32, 512, 16384, 512, 2_000_000, True, None)
    assert (config.model_id, config.dimension, config.hostname, config.port, config.backend) == \
        ("teibatch/hashing-384", 384, "127.0.0.1", 0, "hashing")
    assert config.model_name == "teibatch/hashing-384"
    assert not config.faults.enabled


def test_api_key_is_not_in_repr() -> None:
    assert "s3cret" not in repr(ServerConfig(api_key="s3cret"))


@pytest.mark.parametrize("options, message", [
    pytest.param({"backend": "onnx"}, "backend must be one of", id="backend"),
    pytest.param({"model_kind": "classifier"}, "model_kind must be one of", id="model-kind"),
    pytest.param({"max_client_batch_size": 0}, "max_client_batch_size must be >= 1", id="batch-size"),
    pytest.param({"port": 70000}, "port must be between", id="port"),
    pytest.param({"max_input_length": 1000, "max_batch_tokens": 512, "auto_truncate": False},
                 "max_input_length must be <= max_batch_tokens", id="input-over-batch-tokens"),
    pytest.param({"simulate_gpu": 0.0}, "simulate_gpu must be > 0", id="simulate-gpu"),
    pytest.param({"default_prompt_name": "q"}, "is not among the prompts", id="prompt-name"),
])
def test_wrong_values_raise(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("options, message", [
    pytest.param({"rate_429": 1.5}, "between 0 and 1", id="rate-range"),
    pytest.param({"rate_429": 0.6, "rate_503": 0.6}, "add up to at most 1", id="rate-sum"),
    pytest.param({"exit_after": 0}, "exit_after must be >= 1", id="exit-after"),
])
def test_wrong_fault_values_raise(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultConfig(**options)  # type: ignore[arg-type]


def test_auto_truncate_caps_max_input_length_to_batch_tokens() -> None:
    assert ServerConfig(max_input_length=1000, max_batch_tokens=512).effective_max_input_length == 512
    assert ServerConfig(max_input_length=100, max_batch_tokens=512).effective_max_input_length == 100


def test_config_from_options_accepts_fault_keys_and_prompt_dicts() -> None:
    config = config_from_options(fault_rate_429=0.25, faults={"seed": 3}, prompts={"query": "q: "})
    assert config.faults == FaultConfig(seed=3, rate_429=0.25)
    assert config.prompts == (("query", "q: "),)
    assert config.with_options(faults={"rate_503": 0.5}).faults == FaultConfig(seed=3, rate_429=0.25,
                                                                               rate_503=0.5)
