"""`srt train`: the click command. The run itself is `srtcli.train.loop.train`.

`--nproc N` is a shorthand for `torchrun --nproc-per-node N -m srtcli train ...`: it checks
the inputs here (so user errors stay one line, without torchrun's failure report) and then
runs torchrun with the same options.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from srtcli.cli.config import config_option
from srtcli.errors import Interrupted
from srtcli.train.loss import AGG_MODES

_PATH = click.Path(path_type=Path)


@click.command()
@config_option
@click.option("--shards", type=_PATH, help="`srt pack` output to train on.")
@click.option("--steps", type=_PATH, help="A raw steps pool: one plain padded row per step (the reference path).")
@click.option("--model", type=_PATH, help="Policy model directory (HF format); default: the bundled model.")
@click.option("--out", type=_PATH, required=True, help="Output directory: final model, checkpoints, metrics.jsonl.")
@click.option("--lr", type=float, default=1e-6, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="Sequences (steps) per optimizer step; shards take whole rows until they have this many. 0 = all.")
@click.option("--micro-batch-tokens", type=click.IntRange(min=0), default=8192, show_default=True,
              help="Gradient accumulation: rows x longest row per forward (0 = one row per forward).")
@click.option("--clip", type=click.FloatRange(min=0), default=0.2, show_default=True, help="PPO clip epsilon.")
@click.option("--kl-coef", type=click.FloatRange(min=0), default=0.0, show_default=True, help="k3 KL to the reference model.")
@click.option("--ref-model", type=_PATH, help="Reference model for the KL term; default: --model.")
@click.option("--loss-agg", type=click.Choice(AGG_MODES), default="token-mean", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=0), default=0, show_default=True, help="Stop after N optimizer steps (0 = no cap).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--attn", type=click.Choice(["auto", "sdpa", "flex", "eager"]), default="auto", show_default=True,
              help="Attention for packed rows; auto: compiled flex on CUDA, SDPA boolean mask on CPU.")
@click.option("--resume", is_flag=True, help="Continue from the latest checkpoint in --out.")
@click.option("--save-every", type=click.IntRange(min=0), default=0, show_default=True, help="Checkpoint every N steps (0 = only at the end).")
@click.option("--lr-schedule", type=click.Choice(["constant", "cosine"]), default="constant", show_default=True)
@click.option("--warmup-steps", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--grad-clip", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Max gradient norm (0 = off).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
              help="The weights', gradients' and optimizer states' dtype.")
@click.option("--mixed-precision", type=click.Choice(["auto", "bf16", "no"]), default="auto", show_default=True,
              help="Run the forwards under bf16 autocast over the --dtype weights; auto: on a CUDA device "
                   "that supports bf16, not on a CPU (docs/train.md).")
@click.option("--skip-bad", is_flag=True, help="Skip malformed pool lines (counted) instead of failing.")
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Data-parallel processes (launches torchrun --nproc-per-node N).")
@click.option("--fsdp", is_flag=True, help="Shard parameters, gradients and optimizer state with FSDP2 (needs --nproc >= 2 or torchrun).")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Score the policy's log-probs as softmax(logits / T)  [default: the temperature the steps "
                   "were sampled at, recorded by srt rollout; 1 where none is]")
@click.option("--gradient-checkpointing", is_flag=True,
              help="Recompute each decoder layer's activations in the backward instead of keeping them: "
                   "a fraction of the memory, for one more forward of each layer (docs/train.md).")
@click.option("--json", "json_mode", is_flag=True, help="Print the final summary as one JSON object.")
@click.pass_context
def train(ctx: click.Context, nproc: int, json_mode: bool, **opts) -> None:
    """Policy-gradient (PPO-clip) training over packed shards or a raw steps pool."""
    from srtcli.train.config import TrainConfig

    cfg = TrainConfig(**opts)
    if nproc > 1:
        from srtcli.train.loop import precheck

        precheck(cfg)  # once here, not once per rank with torchrun's failure report
        try:
            sys.exit(_launch(ctx, nproc, json_mode))
        except KeyboardInterrupt:
            raise interrupted(cfg.out) from None
    summary = _run(cfg, json_mode)
    if summary is not None:  # rank 0
        if json_mode:
            click.echo(json.dumps(summary, separators=(",", ":")))
        else:
            click.echo(f"trained {summary['steps_run']} steps in {summary['wall_s']:.1f}s; model in {summary['out']}")


def _run(cfg, json_mode: bool) -> dict | None:
    """This process's part of the run (one of the ranks under torchrun); the summary on rank 0."""
    from srtcli.train import dist
    from srtcli.train.loop import train as run

    info = dist.init()
    try:
        summary = run(cfg, info, json_mode)
        # leave together: a gloo rank tearing down while another still writes the last
        # checkpoint has been seen to abort at exit (only on success: a failed rank must exit)
        dist.barrier(info)
    except KeyboardInterrupt:
        if not info.main:  # rank 0 says it once
            sys.exit(Interrupted.exit_code)
        raise interrupted(cfg.out) from None
    finally:
        dist.shutdown(info)
    return summary if info.main else None


def interrupted(out: Path) -> Interrupted:
    """Ctrl-C: where `--resume` would continue from (the latest complete checkpoint)."""
    from srtcli.train.checkpoint import has_run, latest_checkpoint

    ckpt = latest_checkpoint(out)
    if ckpt is not None:
        return Interrupted(f"srt train: interrupted; rerun with --resume to continue from step "
                           f"{int(ckpt.name[5:])} ({ckpt})")
    if has_run(out):
        return Interrupted(f"srt train: interrupted before the first checkpoint; rerun with --resume "
                           f"to start over in {out} (--save-every N keeps progress)")
    return Interrupted(f"srt train: interrupted; nothing was written to {out}")


def _launch(ctx: click.Context, nproc: int, json_mode: bool) -> int:
    """torchrun with every resolved option (config-file values included), minus --nproc."""
    args = []
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in ("nproc", "config"):
            continue
        value = ctx.params.get(p.name)
        flag = p.opts[0]
        if p.is_flag:
            if value:
                args.append(flag)
        elif value is not None:
            args += [flag, str(value)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "srtcli", "train", *args]
    return subprocess.run(cmd).returncode
