"""Fixtures every test package may use: a real redis-server shared by the tests of the cache
server (one per test session; `redis_url` names a fresh cache on it, its own prefix), and the
real pretrained model (`real_model`)."""

from __future__ import annotations

import os
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


# The real pretrained model (SmolLM2-135M-Instruct) that examples/smollm2/prepare.py writes; CI
# prepares it once, as the README's install command does. Tests that need it skip without it.
ROOT = Path(__file__).resolve().parents[1]
REAL_MODEL = Path(os.environ.get("SRT_REAL_MODEL", ROOT / "models" / "smollm2"))


@pytest.fixture(scope="session")
def real_model() -> Path:
    if not (REAL_MODEL / "prepared.json").is_file():
        pytest.skip(f"no real model at {REAL_MODEL}: python examples/smollm2/prepare.py {REAL_MODEL}")
    return REAL_MODEL
