"""Fixtures of the native-harness tests; the seed's source session is built by ``seed.seed_source``."""

from __future__ import annotations

import pytest

from .seed import SOURCE_KEY, Fixture, seed_source

__all__ = ["SOURCE_KEY", "Fixture", "seeded"]


@pytest.fixture
def seeded(transactional_db) -> Fixture:
    return seed_source()
