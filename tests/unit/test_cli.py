"""The command line: version, honest stubs, and the demo."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crosstalk import __version__
from crosstalk.cli import _PLANNED, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"crosstalk {__version__}"


@pytest.mark.parametrize("command", sorted(_PLANNED))
def test_unbuilt_subcommands_say_so(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command]) == 2
    assert "not built yet" in capsys.readouterr().err


def test_no_command_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_demo_runs_as_a_newcomer_would() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "crosstalk", "demo"], capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "named 'reviewer'" in out.stdout
    assert "fallback name" in out.stdout
    assert "discarded ['torn_tail']" in out.stdout
    assert "live descriptors left: 0" in out.stdout
