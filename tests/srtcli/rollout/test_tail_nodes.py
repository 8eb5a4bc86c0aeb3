"""`--tail-nodes`: the flag and the config key set the engine's tail trees (the flag wins), the
default follows the device (`RolloutConfig.tail_trees`), and a model whose attention cannot
verify a tree is refused in one line when they are asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from srtcli.errors import SrtError
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.embedded import check_tree_attention
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.four_ways import rollout_four_ways


def test_the_flag_or_the_config_key_sets_the_engines_tail_trees(tmp_path: Path, monkeypatch):
    from srtcli.rollout.engine import engine

    seen, init = [], engine.Engine.__init__

    def spy(self, *a, **kw):
        seen.append(kw["tail_nodes"])
        init(self, *a, **kw)

    monkeypatch.setattr(engine.Engine, "__init__", spy)
    rollout_four_ways(tmp_path, ["--tail-nodes", "12"], "tail-nodes: 40\n", ["--tail-nodes", "12"],
                      extra=("--device", "cpu", "--cache", str(tmp_path / "cache")))
    assert seen == [0, 12, 40, 12]  # off by default on a CPU


def test_tail_trees_on_an_attention_that_cannot_verify_a_tree_are_refused():
    model = tiny_model("qwen2")
    check_tree_attention(RolloutConfig("p", tail_nodes=8), model)  # sdpa: fine
    model.config._attn_implementation = "flash_attention_2"
    check_tree_attention(RolloutConfig("p"), model)  # the default: off there, nothing to refuse
    check_tree_attention(RolloutConfig("p", tail_nodes=0), model)
    with pytest.raises(SrtError, match="--tail-nodes needs the model's sdpa or eager attention"):
        check_tree_attention(RolloutConfig("p", tail_nodes=8), model)
