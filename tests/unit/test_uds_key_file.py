"""The uds ingress's key, kept between frames (``socket_files.KeyFile``): whatever happens to
the file after it was kept — replaced, rewritten in place with the same length, made readable
by others, swapped for a symlink, removed — the next frame sees it, as a fresh read would."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from crosstalk.ingress import socket_files
from crosstalk.ingress.socket_files import KeyFile, read_key


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(socket_files, "KEY_SETTLED_NS", -(10 ** 12))  # kept at once
    path = tmp_path / "agent.key"
    path.write_text("a" * 32 + "\n")
    path.chmod(0o600)
    return path


def kept(kf: KeyFile) -> bool:
    return kf._kept is not None


def test_a_settled_key_is_kept_and_read_once(key: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    assert kept(kf)
    opened: list[object] = []
    real_open = os.open
    monkeypatch.setattr(socket_files.os, "open",
                        lambda *a, **k: opened.append(a) or real_open(*a, **k))
    assert kf.current() == "a" * 32
    assert opened == []  # answered from the lstat alone


def test_a_key_written_just_now_is_not_kept(key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket_files, "KEY_SETTLED_NS", 10 ** 15)
    monkeypatch.setattr(socket_files, "KEY_SETTLED_FINE_NS", 10 ** 15)
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    assert not kept(kf)


def test_a_rewrite_in_place_of_the_same_length_is_seen(key: Path) -> None:
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    st = os.stat(key)
    with open(key, "r+") as f:
        f.write("b" * 32 + "\n")
    os.utime(key, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a later tick
    assert kf.current() == "b" * 32


def test_a_replacement_is_seen(key: Path) -> None:
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    new = key.with_suffix(".new")
    new.write_text("c" * 32 + "\n")
    new.chmod(0o600)
    os.replace(new, key)
    assert kf.current() == "c" * 32


def test_a_key_made_readable_by_others_is_refused_and_told(key: Path) -> None:
    told: list[int] = []
    kf = KeyFile(key, on_unsafe=lambda: told.append(1))
    assert kf.current() == "a" * 32
    key.chmod(0o644)
    assert kf.current() is None
    assert told == [1]
    assert read_key(key, check_mode=True) is None  # as a fresh read says


def test_a_symlink_in_its_place_is_refused(key: Path, tmp_path: Path) -> None:
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    target = tmp_path / "elsewhere"
    target.write_text("a" * 32 + "\n")
    target.chmod(0o600)
    key.unlink()
    key.symlink_to(target)
    assert kf.current() is None


def test_a_removed_key_fails_every_frame(key: Path) -> None:
    kf = KeyFile(key)
    assert kf.current() == "a" * 32
    key.unlink()
    assert kf.current() is None
    assert not kept(kf)


def test_settled_waits_longer_for_a_filesystem_of_whole_seconds(tmp_path: Path) -> None:
    from crosstalk.store.files import SETTLED_FINE_NS, SETTLED_NS, settled
    path = tmp_path / "f"
    path.write_bytes(b"x")
    base = 1_700_000_000 * 10 ** 9
    os.utime(path, ns=(base, base + 123_456_789))  # sub-second times: a fine filesystem
    st = os.lstat(path)
    changed = max(st.st_mtime_ns, st.st_ctime_ns)
    assert not settled(st, changed + SETTLED_FINE_NS)
    assert settled(st, changed + SETTLED_FINE_NS + 1)
    # A filesystem of whole seconds (the ctime here cannot be set, so it is made up).
    coarse = cast(os.stat_result, SimpleNamespace(st_mtime_ns=base, st_ctime_ns=base))
    assert not settled(coarse, base + SETTLED_FINE_NS + 1)
    assert not settled(coarse, base + SETTLED_NS)
    assert settled(coarse, base + SETTLED_NS + 1)
