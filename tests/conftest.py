import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end-to-end training runs (tens of seconds each); deselect with -m 'not slow'")
