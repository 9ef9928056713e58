"""Where state lives, and that it is private (seed §3 paths, F5)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crosstalk.config import PRIVATE_DIR_MODE, StateDirError, ensure_private_dir, state_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_crosstalk_home_wins() -> None:
    env = {"CROSSTALK_HOME": "/a/ct", "XDG_STATE_HOME": "/b/xdg", "HOME": "/c/home"}
    assert state_dir(env) == Path("/a/ct")


def test_xdg_state_home_next() -> None:
    env = {"XDG_STATE_HOME": "/b/xdg", "HOME": "/c/home"}
    assert state_dir(env) == Path("/b/xdg/crosstalk")


def test_home_last() -> None:
    assert state_dir({"HOME": "/c/home"}) == Path("/c/home/.local/state/crosstalk")


def test_empty_values_are_unset() -> None:
    env = {"CROSSTALK_HOME": "", "XDG_STATE_HOME": "", "HOME": "/c/home"}
    assert state_dir(env) == Path("/c/home/.local/state/crosstalk")
    env = {"CROSSTALK_HOME": "", "XDG_STATE_HOME": "/b/xdg", "HOME": "/c/home"}
    assert state_dir(env) == Path("/b/xdg/crosstalk")


def test_explicit_env_ignores_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSTALK_HOME", "/from/process")
    monkeypatch.setenv("XDG_STATE_HOME", "/from/process/xdg")
    assert state_dir({"HOME": "/c/home"}) == Path("/c/home/.local/state/crosstalk")


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSTALK_HOME", "/from/process")
    assert state_dir() == Path("/from/process")
    monkeypatch.delenv("CROSSTALK_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", "/from/xdg")
    assert state_dir() == Path("/from/xdg/crosstalk")


def test_no_home_in_env_falls_back_to_the_user_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/pw/home")
    assert state_dir({}) == Path("/pw/home/.local/state/crosstalk")


def test_ensure_private_dir_creates_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "crosstalk"
    old = os.umask(0o022)
    try:
        assert ensure_private_dir(target) == target
    finally:
        os.umask(old)
    assert target.is_dir()
    assert _mode(target) == PRIVATE_DIR_MODE == 0o700


def test_ensure_private_dir_is_0700_even_under_an_odd_umask(tmp_path: Path) -> None:
    target = tmp_path / "ct"
    old = os.umask(0o277)  # would leave the new directory 0500
    try:
        ensure_private_dir(target)
    finally:
        os.umask(old)
    assert _mode(target) == 0o700


@pytest.mark.parametrize("loose", [0o755, 0o777, 0o701, 0o500])
def test_ensure_private_dir_tightens_an_existing_dir(tmp_path: Path, loose: int) -> None:
    target = tmp_path / "ct"
    target.mkdir()
    os.chmod(target, loose)
    assert _mode(target) == loose
    ensure_private_dir(target)
    assert _mode(target) == 0o700


def test_ensure_private_dir_is_idempotent_and_keeps_contents(tmp_path: Path) -> None:
    target = ensure_private_dir(tmp_path / "ct")
    (target / "keep").write_text("x")
    ensure_private_dir(target)
    assert (target / "keep").read_text() == "x"
    assert _mode(target) == 0o700


def test_ensure_private_dir_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "ct"
    target.write_text("not a dir")
    with pytest.raises((StateDirError, FileExistsError)):
        ensure_private_dir(target)
    assert target.read_text() == "not a dir"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create a foreign-owned directory")
def test_ensure_private_dir_refuses_a_foreign_owner(tmp_path: Path) -> None:
    target = tmp_path / "ct"
    target.mkdir(mode=0o755)
    os.chown(target, 12345, 12345)
    with pytest.raises(StateDirError, match="owned by uid 12345"):
        ensure_private_dir(target)
    assert _mode(target) == 0o755  # not chmod'ed on behalf of someone else


def test_tilde_expands_with_the_given_home() -> None:
    resolve = state_dir
    env = {"HOME": "/home/other", "CROSSTALK_HOME": "~/ct"}
    assert str(resolve(env)) == "/home/other/ct"
    assert str(resolve({"HOME": "/home/other", "XDG_STATE_HOME": "~/st"})) == (
        "/home/other/st/crosstalk"
    )


def test_a_file_where_the_state_dir_should_be_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a dir")
    with pytest.raises(StateDirError, match="not a directory"):
        ensure_private_dir(tmp_path / "state")
    with pytest.raises(StateDirError):
        ensure_private_dir(tmp_path / "state" / "sub")


def test_journal_path_is_per_agent_under_the_state_dir() -> None:
    from crosstalk.config import journal_path

    assert journal_path(Path("/s"), "0123456789abcdef") == Path("/s/journal/0123456789abcdef.jsonl")


def test_uds_key_path_replaces_the_sock_suffix() -> None:
    from crosstalk.config import uds_key_path

    assert uds_key_path(Path("/run/cc-socks/0123456789abcdef.sock")) == Path(
        "/run/cc-socks/0123456789abcdef.key")
    assert uds_key_path(Path("/run/a.b.sock")) == Path("/run/a.b.key")
    assert uds_key_path(Path("/run/inbox")) == Path("/run/inbox.key")
