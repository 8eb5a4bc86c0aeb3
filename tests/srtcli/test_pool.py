"""The steps pool: validation with file:line errors, GRPO advantages, crash-safe appends."""

import json

import pytest

from srtcli.advantages import grpo_advantages
from srtcli.errors import SrtError
from srtcli.pool import PoolWriter, StepRecord, read_pool


def step(uid="p", traj="t0", k=0, ids=(1, 2, 3), reward=1.0, **kw):
    n = len(ids)
    return StepRecord(uid, traj, k, list(ids), [0] + [1] * (n - 1), [0.0] + [-0.5] * (n - 1), reward, **kw)


def test_round_trip(tmp_path):
    with PoolWriter(tmp_path / "a.jsonl") as w:
        w.write(step())
        w.write(step(traj="t1", advantage=0.5, meta={"sample": 1}))
    got = read_pool(tmp_path)
    assert got == [step(), step(traj="t1", advantage=0.5, meta={"sample": 1})]


@pytest.mark.parametrize(
    "line, reason",
    [
        ("{not json", "malformed JSON"),
        (json.dumps({"prompt_uid": "p"}), "missing field"),
        (json.dumps(json.loads(step().to_json()) | {"input_ids": [1, -2, 3]}), "negative"),
        (json.dumps(json.loads(step().to_json()) | {"loss_mask": [0, 1]}), "lengths disagree"),
        (json.dumps(json.loads(step().to_json()) | {"step": "0"}), "`step`"),
        (json.dumps(json.loads(step().to_json()) | {"input_ids": [1, 2.5, 3]}), "`input_ids`"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, reason):
    (tmp_path / "a.jsonl").write_text(step().to_json() + "\n" + line + "\n")
    with pytest.raises(SrtError) as e:
        read_pool(tmp_path)
    assert f"a.jsonl:2: " in e.value.message and reason in e.value.message
    stats = {}
    assert len(read_pool(tmp_path, skip_bad=True, stats=stats)) == 1 and stats["skipped"] == 1


def test_empty_and_missing_pool(tmp_path):
    with pytest.raises(SrtError, match="empty steps pool"):
        read_pool(tmp_path)
    with pytest.raises(SrtError, match="no such steps pool"):
        read_pool(tmp_path / "nope")


def test_grpo_advantages_use_the_last_step_and_population_std():
    steps = [step(traj="a", k=0, reward=0.0), step(traj="a", k=1, reward=1.0), step(traj="b", reward=0.0)]
    adv = grpo_advantages(steps)
    # trajectories a: R=1, b: R=0 -> mean 0.5, std 0.5
    assert adv == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)
    assert grpo_advantages([step(advantage=3.0)]) == [3.0]


def test_resume_cuts_a_partial_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(step().to_json() + "\n" + step().to_json()[:20])
    with pytest.raises(SrtError, match="--resume"):
        PoolWriter(path)
    with PoolWriter(path, resume=True) as w:
        w.write(step(traj="t1"))
    assert [s.trajectory_id for s in read_pool(tmp_path)] == ["t0", "t1"]


def test_a_step_written_twice_is_refused_naming_its_line(tmp_path):
    lines = [step(traj="t0"), step(traj="t1"), step(uid="q", traj="t0"), step(traj="t0", k=1), step(traj="t1")]
    (tmp_path / "a.jsonl").write_text("".join(s.to_json() + "\n" for s in lines))
    with pytest.raises(SrtError) as e:
        read_pool(tmp_path)
    assert e.value.message.startswith(f"{tmp_path / 'a.jsonl'}:5: duplicate step")
    assert "'t1' step 0" in e.value.message and "already at a.jsonl:2" in e.value.message
    stats = {}
    kept = read_pool(tmp_path, skip_bad=True, stats=stats)  # the first copy is kept
    assert [(s.prompt_uid, s.trajectory_id, s.step) for s in kept] == [("p", "t0", 0), ("p", "t1", 0),
                                                                      ("q", "t0", 0), ("p", "t0", 1)]
    assert stats["skipped"] == 1
    (tmp_path / "a.jsonl").write_text(step().to_json() + "\n")
    (tmp_path / "b.jsonl").write_text(step(traj="t9").to_json() + "\n" + step().to_json() + "\n")
    with pytest.raises(SrtError, match=r"b\.jsonl:2: duplicate step.* already at a\.jsonl:1"):
        read_pool(tmp_path)


def test_pack_and_train_refuse_a_pool_with_a_duplicated_line(tmp_path):
    from click.testing import CliRunner

    from srtcli.cli import cli

    steps = [step(traj=f"t{i}", ids=(1, 2, 3 + i), reward=float(i)) for i in range(3)]
    text = "".join(s.to_json() + "\n" for s in steps)
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "rollout.jsonl").write_text(text + steps[1].to_json() + "\n")  # one group twice over
    for argv in (["pack", "--steps", tmp_path / "pool", "--out", tmp_path / "shards"],
                 ["train", "--steps", tmp_path / "pool", "--out", tmp_path / "ckpt"]):
        r = CliRunner().invoke(cli, [str(a) for a in argv])
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
        assert f"{tmp_path / 'pool' / 'rollout.jsonl'}:4: duplicate step" in r.output
    assert not (tmp_path / "shards").exists() and not (tmp_path / "ckpt").exists()
