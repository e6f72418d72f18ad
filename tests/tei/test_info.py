"""Limits from ``/info``: bad values replaced and logged; job overrides only lower them."""

from __future__ import annotations

import logging

import pytest

from teibatch.tei import ClientLimits, ServerInfo
from teibatch.tei.info import version_tuple

INFO = ServerInfo.from_json({
    "model_id": "BAAI/bge-m3", "model_sha": None, "model_dtype": "float16", "served_model_name": "bge",
    "model_type": {"embedding": {"pooling": "cls"}}, "max_concurrent_requests": 512, "max_input_length": 8192,
    "max_batch_tokens": 16384, "max_batch_requests": None, "max_client_batch_size": 32, "auto_truncate": True,
    "tokenization_workers": 8, "version": "1.9.3", "sha": None, "docker_label": None})


def test_info_fields() -> None:
    assert (INFO.model_kind, INFO.pooling, INFO.served_model_name, INFO.max_batch_tokens) == (
        "embedding", "cls", "bge", 16384)
    assert ServerInfo.from_json(INFO.to_json()) == INFO


@pytest.mark.parametrize(("version", "base64"), [("1.9.3", True), ("1.3.0", True), ("1.2.3", False),
                                                 (None, True), ("main", True), ("1.10.0-rc1", True)])
def test_base64_needs_tei_1_3(version: str | None, base64: bool) -> None:
    info = ServerInfo.from_json({**INFO.to_json(), "version": version})
    assert info.supports_base64 is base64
    assert version_tuple("1.10.0") == (1, 10, 0)


def test_overrides_only_lower_the_servers_limits() -> None:
    limits = ClientLimits.derive(INFO, max_batch_size=64, max_inflight_inputs=100, payload_limit=1_000_000,
                                 max_input_length=512)
    assert limits == ClientLimits(max_batch_size=32, max_inflight_inputs=100, payload_limit=1_000_000,
                                  max_input_chars=512 * 250)
    assert ClientLimits.derive(INFO).max_input_chars == 8192 * 250


TEI_INFO = {**INFO.to_json(), "model_type": {"embedding": {"pooling": "cls"}}}
del TEI_INFO["replaced"], TEI_INFO["model_kind"], TEI_INFO["pooling"]


@pytest.mark.parametrize(("key", "value", "used", "shown"), [
    pytest.param("max_client_batch_size", 0, 1, "0 -> 1", id="batch-0"),
    pytest.param("max_client_batch_size", -1, 1, "-1 -> 1", id="batch-negative"),
    pytest.param("max_client_batch_size", None, 1, "null -> 1", id="batch-null"),
    pytest.param("max_client_batch_size", "32", 1, '"32" -> 1', id="batch-string"),
    pytest.param("max_client_batch_size", 32.0, 1, "32.0 -> 1", id="batch-float"),
    pytest.param("max_client_batch_size", False, 1, "false -> 1", id="batch-bool"),
    pytest.param("max_client_batch_size", ..., 32, "missing -> 32", id="batch-missing"),
    pytest.param("max_concurrent_requests", -5, 32, "-5 -> 32", id="inflight-negative"),
    pytest.param("max_concurrent_requests", ..., 512, "missing -> 512", id="inflight-missing"),
    pytest.param("max_input_length", [8192], 512, "[8192] -> 512", id="length-list"),
    pytest.param("max_input_length", ..., 512, "missing -> 512", id="length-missing"),
    pytest.param("max_batch_tokens", 0, 16384, "0 -> 16384", id="batch-tokens-0"),
    pytest.param("max_batch_tokens", ..., 16384, "missing -> 16384", id="batch-tokens-missing"),
    pytest.param("max_batch_requests", "8", None, '"8" -> null', id="batch-requests-string"),
    pytest.param("auto_truncate", 1, False, "1 -> false", id="auto-truncate-int"),
    pytest.param("auto_truncate", ..., False, "missing -> false", id="auto-truncate-missing"),
    pytest.param("version", 193, None, "193 -> null", id="version-int"),
])
def test_bad_or_missing_values_are_replaced_logged_and_recorded(caplog: pytest.LogCaptureFixture, key: str,
                                                                value: object, used: object, shown: str) -> None:
    data = {k: v for k, v in TEI_INFO.items() if k != key}
    if value is not ...:
        data[key] = value
    with caplog.at_level(logging.WARNING, logger="teibatch.tei.info"):
        info = ServerInfo.from_json(data, server="http://10.0.0.7:80")
    assert getattr(info, key) == used
    assert info.replaced == {key: shown}
    (record,) = caplog.records
    seen, _, value_used = shown.partition(" -> ")
    assert record.getMessage().startswith(f"http://10.0.0.7:80: /info {key} is {seen}; using {value_used} (")
    # The report's copy reads back the same, without a second warning.
    caplog.clear()
    assert ServerInfo.from_json(info.to_json()) == info
    assert caplog.records == []


def test_valid_values_are_kept_as_they_are(caplog: pytest.LogCaptureFixture) -> None:
    data = {**TEI_INFO, "max_client_batch_size": 1, "max_batch_requests": 4, "auto_truncate": False}
    with caplog.at_level(logging.WARNING):
        info = ServerInfo.from_json(data)
    assert (info.max_client_batch_size, info.max_batch_requests, info.auto_truncate, info.replaced) == (1, 4, False, {})
    assert info.supports_base64 and caplog.records == []
    assert ServerInfo.from_json({**TEI_INFO, "max_batch_requests": None}).replaced == {}


def test_an_unknown_auto_truncate_rules_out_base64() -> None:
    info = ServerInfo.from_json({**TEI_INFO, "auto_truncate": "false"})
    assert info.version == "1.9.3" and not info.supports_base64
