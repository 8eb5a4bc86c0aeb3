"""bench/forward_rows.py: every forward's rows recorded while open (the engine restored after),
and sorted by how full the batch ran, each forward in exactly one bucket."""

from bench.forward_rows import by_fill, count_rows
from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from tests.srtcli.rollout.engine.support import tiny_model
from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive


def test_every_forward_is_counted_with_its_rows():
    eng = Engine(tiny_model("qwen2"), SamplingParams(0.0), make_drafter("none"), slots=4, budget=2, max_len=64)
    seqs = [Sequence(p, max_new_tokens=3 + 2 * i) for i, p in enumerate(PROMPTS)]
    run = Engine._run
    with count_rows() as rows:
        drive(eng, seqs)
    assert Engine._run is run
    assert len(rows) == eng.stats.forwards and sum(rows) == eng.stats.row_forwards
    assert max(rows) == 4 and min(rows) == 1  # a full batch, then the tail


def test_buckets_cover_the_slots_once():
    assert [label for label, _ in by_fill([], 32)] == ["1-4", "5-8", "9-16", "17-24", "25-32"]
    rows = list(range(1, 33)) + [1, 32]
    assert [n for _, n in by_fill(rows, 32)] == [5, 4, 8, 8, 9]
    assert by_fill([1, 3, 3, 2], 3) == [("1", 1), ("2", 1), ("3", 2)]  # few slots: no empty ranges
