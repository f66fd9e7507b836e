"""The registry fixture (``fixture.RegistryFixture``), one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.registry.fixture import RegistryFixture


@pytest.fixture(scope="module")
def registry() -> Iterator[RegistryFixture]:
    with RegistryFixture() as served:
        yield served
