"""The package surface: a sorted __all__, and no heavy or foreign imports."""

from __future__ import annotations

import subprocess
import sys

import teibatch.server


def test_all_is_sorted_and_importable() -> None:
    assert teibatch.server.__all__ == sorted(teibatch.server.__all__)
    for name in teibatch.server.__all__:
        assert getattr(teibatch.server, name) is not None


def test_importing_the_server_pulls_in_nothing_heavy() -> None:
    code = ("import sys, teibatch.server, teibatch.server.cli; "
            "print(','.join(m for m in ('ray', 'pyarrow', 'torch', 'sentence_transformers', 'httpx') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=30).stdout.strip()
    assert loaded == ""
