"""Fixtures every test directory shares."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Every ``pytest.mark.anyio`` test runs on asyncio: the product runs on asyncio only."""
    return "asyncio"
