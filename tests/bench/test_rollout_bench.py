"""`rollout_bench.py --repeat N`: every round repeats the last epoch from the cache each config had
before it, and the ratios are per round (median) and of the fastest rounds. `--entropy`: the
policy's mean entropy over its generated tokens, as separate forwards give it, and its plot."""

from pathlib import Path

import torch

from bench.rollout_bench import fastest_ratio, policy_entropy, repeat_last_epoch, report_entropy, round_ratios, snapshot


def run(wall: float) -> dict:
    return {"wall_s": wall, "model_s": wall / 2, "target_forwards": 4, "generated_tokens": 8}


def test_ratios_are_per_round_and_of_the_fastest_rounds():
    srt, none = [run(1.0), run(4.0)], [run(2.0), run(3.0)]
    assert round_ratios(srt, none) == [2.0, 0.75]
    assert fastest_ratio(srt, none) == 2.0  # 2 s / 1 s: a slow round of one config does not count
    assert round_ratios(srt, none, lambda s: s["model_s"]) == [2.0, 0.75]


def test_every_round_starts_from_the_cache_before_the_last_epoch(tmp_path: Path, capsys):
    cache = tmp_path / "cache-srt"
    cache.mkdir()
    (cache / "tree").write_text("epochs 1-2")
    snapshot(cache)
    (cache / "tree").write_text("epochs 1-3")  # what the last epoch left must not be repeated from
    seen = []

    def epoch(name: str, e: int, at: Path, out: Path, drafter: object) -> dict:
        seen.append((name, e, (at / "tree").read_text() if at.exists() else None, drafter))
        at.mkdir(exist_ok=True)
        (at / "tree").write_text("changed")  # a round's writes stay in its own copy
        return {**run(1.0), "target_forwards": 4 if name == "srt" else 5}

    out = repeat_last_epoch(2, 3, tmp_path, epoch, {"srt": 4, "none": 4})
    assert [len(v) for v in out.values()] == [2, 2]
    assert [s[2] for s in seen if s[0] == "srt"] == ["epochs 1-2", "epochs 1-2"]
    assert all(e == 3 and d is None for _, e, _, d in seen)
    assert "none: round 1 took 5 forwards, the last epoch 4: not the same work" in capsys.readouterr().out


def test_policy_entropy_is_the_mean_over_generated_tokens(tmp_path: Path):
    from srtcli.models import load_model
    from srtcli.pool import PoolWriter, StepRecord
    from srtcli.tiny_model import make_model_dir

    model_path = make_model_dir(tmp_path / "model", sharp=3.0)
    steps = [StepRecord("a", "t0", 0, [1, 5, 6, 7, 8], [0, 0, 1, 1, 1], [0.0] * 5, 0.0),
             StepRecord("a", "t1", 0, [1, 5, 6, 9], [0, 0, 1, 1], [0.0] * 4, 1.0),
             StepRecord("b", "t2", 0, [2, 3, 4, 4, 4, 4], [0, 1, 1, 0, 1, 1], [0.0] * 6, 0.0)]
    with PoolWriter(tmp_path / "pool" / "steps.jsonl") as w:
        for s in steps:
            w.write(s)
    model = load_model(model_path, torch.float32).eval()
    ents = []
    with torch.no_grad():
        for s in steps:
            logp = model(input_ids=torch.tensor([s.input_ids])).logits[0, :-1].float().log_softmax(-1)
            ent = -(logp.exp() * logp).sum(-1)
            ents += [float(e) for e, m in zip(ent, s.loss_mask[1:]) if m]
    assert abs(policy_entropy(model_path, tmp_path / "pool") - sum(ents) / len(ents)) < 1e-5

    results = {"entropy": [2.0, 1.5], "srt": [{"draft_acceptance_rate": 0.3}, {"draft_acceptance_rate": 0.4}],
               "none": [{"draft_acceptance_rate": 0.0}] * 2}
    report_entropy(results, ["none", "srt"], str(tmp_path / "acc.png"))
    assert (tmp_path / "acc.png").stat().st_size > 0
