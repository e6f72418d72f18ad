"""teibatch's own stderr lines and native code's descriptor 2, apart (teibatch/native_stderr.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from teibatch import native_stderr

SCRIPT = textwrap.dedent("""
    import os, sys
    from teibatch.native_stderr import quiet_native, separate
    separate()
    os.write(2, b"native before\\n")
    print("own before", file=sys.stderr)
    quiet_native()
    os.write(2, b"native after\\n")
    print("own after", file=sys.stderr)
    sys.stderr.write("own unflushed")
    os._exit(0)
""")


def test_after_quiet_native_only_teibatchs_own_lines_reach_stderr() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["native before", "own before", "own after", "own unflushed"]


def test_without_separate_quiet_native_leaves_descriptor_2_alone() -> None:
    script = SCRIPT.replace("separate()\n", "")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "native after" in done.stderr.splitlines()


def test_in_process_the_test_runners_streams_are_kept(capsys) -> None:
    stream = sys.stderr
    native_stderr.separate()  # pytest's captured stderr is not descriptor 2's own stream
    assert sys.stderr is stream
    native_stderr.quiet_native()
    print("still captured", file=sys.stderr)
    assert "still captured" in capsys.readouterr().err
