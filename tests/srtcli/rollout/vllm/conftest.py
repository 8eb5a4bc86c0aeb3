"""Shared by the vLLM engine tests: the first arith prompts as a prompts file."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
N_PROMPTS = 6  # prompts per rollout in the engine and agent tests


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    lines = (ROOT / "examples/arith/prompts.jsonl").read_text().splitlines()[:N_PROMPTS]
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p
