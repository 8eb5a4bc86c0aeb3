"""`nodes_bench.py`: how the prompts are dealt to the nodes each epoch, and a `--quick` run end to
end (real `srt rollout` processes, a real redis-server) that gives every config's figures."""

import json
import shutil
from pathlib import Path

import pytest

from bench.nodes_bench import CONFIGS, Bench, RedisServer, deal, main, parse, shuffled

NO_SERVER = pytest.mark.skipif(shutil.which("redis-server") is None,
                               reason="redis-server is not installed (apt-get install redis-server)")


def test_every_prompt_goes_to_exactly_one_node_each_epoch():
    for prompts, nodes in ((64, 4), (10, 3), (3, 4)):
        for epoch in range(4):
            shares = deal(prompts, nodes, epoch)
            assert len(shares) == nodes
            assert sorted(i for s in shares for i in s) == list(range(prompts))
            assert [len(s) for s in shares] == [len(range(j, prompts, nodes)) for j in range(nodes)]  # round-robin
            merged = [None] * prompts
            for j, s in enumerate(shares):
                merged[j::nodes] = s  # node j takes the j-th, (j + nodes)-th, ... of the epoch's order
            assert merged == shuffled(prompts, epoch)


def test_each_epoch_deals_differently_and_the_same_every_time():
    deals = [deal(64, 4, e) for e in range(4)]
    assert all(deals[a] != deals[b] for a in range(4) for b in range(a))
    assert deals == [deal(64, 4, e) for e in range(4)]  # deterministic
    assert deal(64, 4, 0, seed=1) != deals[0]
    # a node sees a prompt's history only where the prompt came back to it
    home = [{i: j for j, s in enumerate(d) for i in s} for d in deals]
    assert sum(home[0][i] == home[1][i] for i in range(64)) < 32


@NO_SERVER
def test_a_repeat_round_starts_from_a_copy_of_the_cache_before_the_last_epoch(tmp_path: Path):
    from srtcli.store_link import open_sequence_store

    uid = "cd" * 16
    server = RedisServer(tmp_path / "redis").start()
    try:
        bench = Bench(parse(["--quick"]), tmp_path, server)
        for config in ("one", "one-redis"):
            with open_sequence_store(bench.cache(config)) as store:
                store.append(uid, [[1, 2, 3]])
                store.tick(2)
            bench.snapshot(config)
            with open_sequence_store(bench.cache(config)) as store:
                store.append(uid, [[4, 5]])  # the last epoch's writes: not in the copy
            bench.restore(config, "-r0")
            with open_sequence_store(bench.cache(config, tag="-r0"), create=False) as copy:
                assert [s.tokens.tolist() for s in copy.read(uid)] == [[1, 2, 3]] and copy.now() == 2
                copy.append(uid, [[6]])  # a round's writes stay in its own copy
            bench.restore(config, "-r1")
            with open_sequence_store(bench.cache(config, tag="-r1"), create=False) as copy:
                assert [s.tokens.tolist() for s in copy.read(uid)] == [[1, 2, 3]]
    finally:
        server.stop()


@pytest.mark.slow
@NO_SERVER
def test_a_quick_run_gives_every_config_its_figures(tmp_path: Path):
    out = main(["--quick", "--repeat", "0", "--load", "--work", str(tmp_path / "work"),
                "--json-out", str(tmp_path / "nodes.json")])
    assert json.loads((tmp_path / "nodes.json").read_text())["figures"] == out["figures"]
    res, f = out["results"], out["figures"]
    assert list(res) == list(CONFIGS) and all(len(r) == 2 for r in res.values())  # 2 epochs
    for c, r in res.items():
        nodes = 2 if c in ("local", "redis") else 1
        for e, s in enumerate(r):
            assert len(s["nodes"]) == nodes and s["target_forwards"] > 0 and s["wall_max"] > 0
            assert sum(n["prompts"] for n in s["nodes"]) == 8
            assert e > 0 or s["cache_hit_min"] == 0.0
    assert res["redis"][1]["cache_hit_min"] == 1.0 and res["one"][1]["cache_hit_min"] == 1.0
    assert f["local_equals_redis_epoch0"]  # every cache cold: the same work
    assert all(f["one_redis_same_work"])  # the server's cache drafts what LMDB's does
    assert len(f["one_redis_vs_one_wall"]) == 2
    for k in ("redis_vs_one_forwards", "local_vs_one_forwards", "redis_vs_local_forwards"):
        assert f[k] > 0
    load = out["load"]
    assert load["tokens_read"] == {"lmdb": 4 * 1024, "redis": 4 * 1024}
    assert set(load["redis_vs_lmdb"]) == {"read", "load_tree", "append_many"}
    assert out["redis_server"]
