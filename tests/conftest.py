"""A real redis-server shared by the tests of the cache server (one per test session): `redis_url`
names a fresh cache on it (its own prefix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cache_store.redis_server import BINARY, NO_SERVER, RedisServer, unique_prefix


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if BINARY is None:
        pytest.skip(NO_SERVER)
    with RedisServer(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url(unique_prefix())
