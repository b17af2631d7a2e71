"""A PostgreSQL study without its driver (psycopg2 is the `postgres` extra, no longer a
dependency of every install): one line naming the extra, before any server is tried.
The real study on a real server is tests/search/test_shared_study.py."""

from __future__ import annotations

import sys

import pytest

from autotune.errors import UsageError
from autotune.search import shared


def test_a_postgresql_study_without_a_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    # None in sys.modules: `import psycopg2` raises ImportError, as where it is not installed.
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(UsageError) as e:
        shared.open_storage("postgresql://tuner:s3cret@127.0.0.1:1/db", grace=60)
    msg = str(e.value)
    assert "pip install 'autotune-loader[postgres]'" in msg and "\n" not in msg, msg
    assert "s3cret" not in msg, msg


def test_a_url_naming_its_driver_or_sqlite_needs_no_check(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    assert shared.with_driver("sqlite:///x.db") == "sqlite:///x.db"
    assert shared.with_driver("postgresql+pg8000://h/db") == "postgresql+pg8000://h/db"
