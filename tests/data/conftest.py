"""A file:// store rooted in the test's tmp_path."""

from __future__ import annotations

import pytest

from mop_airflow.store import Store


@pytest.fixture
def store_dir(tmp_path):
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def store(store_dir):
    return Store(f"file://{store_dir}")
