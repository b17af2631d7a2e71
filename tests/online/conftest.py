"""The online loader's tests keep their settings cache in a temporary directory."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def decisions(caplog):
    """The autotune.online records, as (event, record)."""
    caplog.set_level(logging.INFO, logger="autotune.online")

    def get():
        return [(getattr(r, "autotune_event", None), r) for r in caplog.records
                if r.name == "autotune.online"]
    return get
