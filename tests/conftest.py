"""Shared fixtures."""
import pytest


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """The app's data and cache folders in this test's tmp_path (the user's are never touched)."""
    monkeypatch.setenv("PLANNER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PLANNER_CACHE", str(tmp_path / "cache"))
    return tmp_path
