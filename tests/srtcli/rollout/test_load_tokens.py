"""`--load-tokens`: a prompt's tree is built from its newest stored rollouts up to that many
tokens, in the embedded drafter and in the vLLM proposer alike (`ProposerSettings.load_tokens`), set by
the flag or the config key (the flag wins)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cache_store.seqstore import LmdbSequenceStore

from cache_store.store import LOAD_TOKENS
from cache_store.uid import prompt_uid
from srtcli.rollout.tree_session import TreeSession
from srtcli.store_link import StoreLink
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.vllm.settings import ProposerSettings, read_settings, write_settings
from srtcli.rollout.vllm.tree_drafts import TreeDrafts
from tests.srtcli.rollout.four_ways import rollout_four_ways

PROMPT = [7, 8, 9]
UID = prompt_uid(PROMPT, "tok-test")
STORED = [[9, 1, 2, 3, 4, 5], [9, 6, 6, 6], [9, 4, 4, 4, 4]]  # oldest first: 6, 4, 5 tokens


def store_with_rollouts(tmp_path: Path) -> LmdbSequenceStore:
    store = LmdbSequenceStore.open(tmp_path / "c")
    store.append(UID, STORED)
    return store


def test_the_embedded_drafter_loads_the_newest_rollouts_that_fit(tmp_path):
    store = store_with_rollouts(tmp_path)
    for bound, kept in ((9, [STORED[1], STORED[2]]), (8, [STORED[2]]), (10**6, STORED)):
        tree = SrtDrafter(TreeSession(StoreLink(store), load_tokens=bound)).session.trees.group(UID).tree
        assert [list(tree.sequence(i)) for i in range(tree.sequences)] == kept
    assert TreeSession(StoreLink(store)).trees.load_tokens == LOAD_TOKENS == RolloutConfig("p").load_tokens
    store.close()


def test_the_vllm_proposer_loads_what_its_table_allows(tmp_path):
    store = store_with_rollouts(tmp_path)
    write_settings(tmp_path / "t.json", ProposerSettings(None, 50, [2], adaptive=False, fingerprint="tok-test", load_tokens=9,
                                           load_steps=1))
    settings = read_settings(tmp_path / "t.json")
    assert settings.load_tokens == 9 and ProposerSettings().load_tokens == LOAD_TOKENS and settings.load_steps == 1
    drafts = TreeDrafts(settings, 4, 100, link=StoreLink(store))
    row = np.zeros((1, 100), dtype=np.int32)
    row[0, :4] = PROMPT + [4]
    drafts.propose([[4]], np.array([4], dtype=np.int32), row)
    tree = drafts.session.trees.groups[UID].tree
    assert [list(tree.sequence(i)) for i in range(2)] == [STORED[1], STORED[2]]  # then its own stream
    assert tree.sequences == 3 and list(tree.sequence(2)) == [9, 4]
    store.close()


def test_the_flag_or_the_config_key_sets_the_bound(tmp_path: Path, monkeypatch):
    from click.testing import CliRunner

    from srtcli.cli import cli
    from srtcli.rollout import embedded

    seen, make = [], embedded.make_drafter_for

    def spy(c, store):
        seen.append(c.load_tokens)
        return make(c, store)

    monkeypatch.setattr(embedded, "make_drafter_for", spy)
    rollout_four_ways(tmp_path, ["--load-tokens", "300"], "load-tokens: 5000\n", ["--load-tokens", "300"],
                      extra=("--cache", str(tmp_path / "cache")))
    assert seen == [LOAD_TOKENS, 300, 5000, 300]
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(tmp_path / "p.jsonl"), "--load-tokens", "0"])
    assert r.exit_code != 0 and "--load-tokens" in r.output and "Traceback" not in r.output
