"""Limits from ``/info``: job overrides only lower them; shares keep the whole run under the server's."""

from __future__ import annotations

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


@pytest.mark.parametrize(("inflight", "parts"), [(512, 3), (8, 2), (8, 8), (9, 4), (100, 7)])
def test_shares_add_up_to_at_most_the_servers_limit(inflight: int, parts: int) -> None:
    limits = ClientLimits(max_batch_size=32, max_inflight_inputs=inflight, payload_limit=2_000_000)
    share = limits.share(parts)
    assert share.max_inflight_inputs >= 1 and share.max_inflight_inputs * parts <= inflight
    assert share.max_batch_size <= share.max_inflight_inputs
    assert parts <= limits.max_parts
