"""Fixtures every test directory shares: the asyncio backend and the journal audit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.journal_audit import OPT_OUT_MARKER, audited


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{OPT_OUT_MARKER}: writes an illegal or damaged journal on purpose; the "
        "journal audit leaves the test alone")


@pytest.fixture
def anyio_backend() -> str:
    """Every ``pytest.mark.anyio`` test runs on asyncio: the product runs on asyncio only."""
    return "asyncio"


@pytest.fixture(autouse=True)
def journal_audit(request: pytest.FixtureRequest) -> Iterator[None]:
    """At teardown, every journal the test wrote must fold through the state table (see
    :mod:`tests.support.journal_audit`; off until ``audit_journal`` exists)."""
    with audited(request):
        yield
