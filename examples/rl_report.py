"""The report of examples/rl_loop.sh: per-epoch metrics, two PNG plots and a markdown summary.

    python examples/rl_report.py RUN_DIR

It reads what the loop left in RUN_DIR (nothing else; it can be rerun at any time):

    RUN_DIR/commands.txt                 every command the loop ran, in order
    RUN_DIR/epoch-N/rollout.json         `srt rollout --json` on the training prompts
    RUN_DIR/epoch-N/pool/rollout.jsonl   the steps pool of that rollout (rewards)
    RUN_DIR/epoch-N/eval.json, eval-pool/rollout.jsonl   the same on the held-back prompts
    RUN_DIR/epoch-N/pack.json, train.json                `srt pack --json`, `srt train --json`

and writes RUN_DIR/report.md, RUN_DIR/metrics.json, RUN_DIR/reward.png and RUN_DIR/accepted.png.
Epoch N's rollout uses the model trained in epoch N-1 (epoch 0: the starting model), so the
reward column is the reward of the policy before that epoch's update.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class EpochRow:
    epoch: int
    train_reward: float | None
    eval_reward: float | None
    accepted_per_forward: float | None
    rollout_wall_s: float | None
    tokens_per_s: float | None
    cache_hit_rate: float | None
    token_ratio: float | None
    train_step_s: float | None


def _json(path: Path) -> dict:
    """The last JSON object line of a file (commands print one JSON object last)."""
    if not path.is_file():
        return {}
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return {}
    return {}


def pool_reward(pool: Path) -> float | None:
    """Mean trajectory reward of a pool: one value per trajectory (its last step's)."""
    files = sorted(pool.glob("*.jsonl")) if pool.is_dir() else []
    last: dict[str, float] = {}
    for f in files:
        for line in f.read_text().splitlines():
            try:
                step = json.loads(line)
            except json.JSONDecodeError:
                continue  # a partial last line of a killed run
            last[step["trajectory_id"]] = float(step["reward"])  # later steps overwrite earlier ones
    return statistics.fmean(last.values()) if last else None


def epoch_row(d: Path, epoch: int) -> EpochRow:
    ro, ev, pk, tr = (_json(d / f) for f in ("rollout.json", "eval.json", "pack.json", "train.json"))
    steps_run = tr.get("steps_run") or tr.get("steps")
    return EpochRow(
        epoch=epoch,
        train_reward=pool_reward(d / "pool"),
        eval_reward=pool_reward(d / "eval-pool"),
        accepted_per_forward=ro.get("accepted_per_forward"),
        rollout_wall_s=ro.get("wall_s"),
        tokens_per_s=ro.get("tokens_per_s"),
        cache_hit_rate=ro.get("cache_hit_rate"),
        token_ratio=pk.get("token_ratio"),
        train_step_s=(tr["wall_s"] / steps_run) if tr.get("wall_s") and steps_run else None,
    )


def collect(run: Path) -> list[EpochRow]:
    dirs = sorted((p for p in run.glob("epoch-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    return [epoch_row(d, int(d.name.split("-")[1])) for d in dirs]


def _fmt(v: object, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def plot(rows: list[EpochRow], run: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI or over ssh
    import matplotlib.pyplot as plt

    made = []
    epochs = [r.epoch for r in rows]
    for name, series, ylabel in [
        ("reward.png", [("train", [r.train_reward for r in rows]), ("eval", [r.eval_reward for r in rows])], "mean reward"),
        ("accepted.png", [("srt drafter", [r.accepted_per_forward for r in rows])], "accepted tokens per forward"),
    ]:
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        for label, ys in series:
            pts = [(e, y) for e, y in zip(epochs, ys) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("epoch (rollout policy = model after epoch-1 updates)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(run / name)
        plt.close(fig)
        made.append(name)
    return made


def markdown(rows: list[EpochRow], run: Path, images: list[str]) -> str:
    head = ["epoch", "train reward", "eval reward", "accepted/forward", "rollout s", "tokens/s",
            "cache hit", "token ratio", "train step s"]
    lines = ["# RL loop report", "", f"Run directory: `{run}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [str(r.epoch), _fmt(r.train_reward), _fmt(r.eval_reward), _fmt(r.accepted_per_forward, 2),
                _fmt(r.rollout_wall_s, 1), _fmt(r.tokens_per_s, 0), _fmt(r.cache_hit_rate, 2),
                _fmt(r.token_ratio), _fmt(r.train_step_s, 2)]
        lines.append("| " + " | ".join(vals) + " |")
    lines += ["", "Epoch N rolls out with the model trained in epoch N-1 (epoch 0: the starting model); the last",
              "epoch is rollout only. Token ratio: packed tokens / unpacked tokens of that epoch's pool.", ""]
    lines += [f"![{name}]({name})" for name in images]
    cmds = run / "commands.txt"
    if cmds.is_file():
        lines += ["", "## Commands", "", "```", cmds.read_text().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: rl_report.py RUN_DIR", file=sys.stderr)
        return 2
    run = Path(args[0])
    rows = collect(run)
    if not rows:
        print(f"{run}: no epoch-* directories", file=sys.stderr)
        return 1
    images = plot(rows, run)
    (run / "metrics.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    (run / "report.md").write_text(markdown(rows, run, images))
    print(json.dumps({"report": str(run / "report.md"), "epochs": len(rows),
                      "train_reward": [r.train_reward for r in rows], "eval_reward": [r.eval_reward for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
