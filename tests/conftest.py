from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end-to-end training runs (tens of seconds each); deselect with -m 'not slow'")


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory) -> Path:
    """XDG cache holding the demo model, built once per session (train.py builds it on first use)."""
    return tmp_path_factory.mktemp("xdg_cache")
