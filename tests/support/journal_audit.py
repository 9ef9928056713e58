"""The journal audit: every journal a test wrote is folded through the state table at teardown.

A journal holds records in the order the product wrote them; folding them through the one state
table (``core/states.py``) must find every transition legal. The audit asks one function,
``audit_journal(path) -> list[str]`` (the problems found, ``[]`` for a sound journal), and
looks for it in :data:`AUDITOR_MODULES`, first match wins. While none of them defines it the
audit is off and the fixture does nothing at all.

Which journals: every path a :class:`~crosstalk.store.journal.Journal` was opened on in this
process during the test, plus every ``<state>/journal/*.jsonl`` under the test's ``tmp_path``
(journals that shims and other child processes wrote). A test that writes an illegal or damaged
journal on purpose is marked ``@pytest.mark.damaged_journal`` and is not audited.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crosstalk.store.journal import Journal

Auditor = Callable[[Path], list[str]]

#: Where ``audit_journal`` may be defined, searched in this order.
AUDITOR_MODULES = ("crosstalk.store.journal", "crosstalk.core.states")
#: The marker of a test whose journals are wrong on purpose.
OPT_OUT_MARKER = "damaged_journal"


def find_auditor() -> Auditor | None:
    """``audit_journal`` from the first of :data:`AUDITOR_MODULES` that has it, else ``None``."""
    for name in AUDITOR_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found = getattr(module, "audit_journal", None)
        if callable(found):
            auditor: Auditor = found
            return auditor
    return None


def state_dir_journals(roots: Iterable[Path]) -> set[Path]:
    """Every ``journal/*.jsonl`` file at any depth under ``roots`` (the state-dir layout)."""
    found: set[Path] = set()
    for root in roots:
        if root.is_dir():
            found.update(p for p in root.rglob("journal/*.jsonl") if p.is_file())
    return found


@contextlib.contextmanager
def opened_journals() -> Iterator[set[Path]]:
    """While inside, the path of every :class:`Journal` constructed is added to the set."""
    paths: set[Path] = set()
    original = Journal.__init__

    @functools.wraps(original)
    def recording(self: Journal, path: Path | str, *args: Any, **kwargs: Any) -> None:
        paths.add(Path(path))
        original(self, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Journal, "__init__", recording)
        yield paths


def audit(paths: Iterable[Path], auditor: Auditor) -> list[str]:
    """The auditor's problems for every journal that still exists, each prefixed by its path."""
    problems: list[str] = []
    for path in sorted(set(paths)):
        if path.is_file():
            problems += [f"{path}: {problem}" for problem in auditor(path)]
    return problems


@contextlib.contextmanager
def audited(request: pytest.FixtureRequest) -> Iterator[None]:
    """The fixture's body: collect the test's journals, fail the test if one folds illegally."""
    auditor = find_auditor()
    if auditor is None or request.node.get_closest_marker(OPT_OUT_MARKER) is not None:
        yield
        return
    roots: list[Path] = []
    if "tmp_path" in request.fixturenames:
        roots.append(request.getfixturevalue("tmp_path"))
    with opened_journals() as opened:
        yield
    problems = audit(opened | state_dir_journals(roots), auditor)
    if problems:
        pytest.fail("journal audit: illegal record sequences\n" + "\n".join(problems),
                    pytrace=False)
