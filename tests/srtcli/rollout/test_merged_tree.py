"""The srt drafter's draft trees (`--draft-mode tree`, the engine's tail trees) merge the row's
prompt tree and run-wide tree (`cache_store.suffix_tree.merged_draft`, checked against its
Python walk in tests/cache_store/test_suffix_tree_merge.py): a token only one of them knows is
still verified."""

from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.sequence import Sequence
from tests.cache_store.test_suffix_tree_merge import paths_of


def test_a_token_only_the_run_wide_tree_knows_is_verified_too():
    drafter = SrtDrafter()
    seq = Sequence([9, 1], max_new_tokens=32, group="g")
    drafter.begin(seq)
    own, shared = drafter.session.trees.groups["g"].tree, drafter.session.trees.shared
    own.add([1, 2, 3, 4], 4.0)  # the prompt's own rollouts: 1 -> 2 -> 3 -> 4
    shared.add([1, 7], 1.0)  # another prompt's: 1 -> 7
    prop = drafter.propose_tree(seq, 4)
    assert paths_of(prop.tokens, prop.parents) == [(2,), (2, 3), (2, 3, 4), (7,)]
