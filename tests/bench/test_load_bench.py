"""The load benchmark (bench/load_bench.py) runs end to end on a small store: its bounded and
whole reads keep the same sequences (it asserts so) for a store within and past the bound."""

from __future__ import annotations

from bench.load_bench import main, measure


def test_both_reads_keep_the_same_newest_sequences():
    within, past = measure(3, 50, 1000, 1), measure(40, 50, 1000, 1)
    assert (within["stored"], within["kept"]) == (3, 3)
    assert (past["stored"], past["kept"]) == (40, 20)


def test_the_table_has_a_row_per_store_size(capsys):
    main(["--stored", "2,20", "--tokens", "30", "--load-tokens", "300", "--repeat", "1"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[:2] for r in rows] == [["2", "2"], ["20", "10"]]
