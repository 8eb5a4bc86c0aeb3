"""Shared pieces for the `srt train` tests (no tests here): tiny real HF models on disk,
steps pools for the exactness scenarios, real packing through `srt pack`'s code and the shard
format on disk, and gradient comparison helpers. `SRT_TEST_DEVICE=cuda` (bench/gpu_check.sh)
computes the gradients on the GPU, where `srt train`'s default tree attention is the compiled
FlexAttention."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from srtcli.train.loss import LossConfig
from srtcli.pool import PoolWriter, StepRecord
from srtcli.train.step import step_gradients
from srtcli.train.dist import DistInfo
from tests.srtcli.rollout.engine.support import DEVICE

torch.set_num_threads(1)

VOCAB = 61


def tiny_model(kind: str = "qwen2", seed: int = 0):
    from srtcli.tiny_model import tiny_model as build

    return build(kind, VOCAB, seed)


def write_tokenizer(path: Path) -> None:
    """A real (word-level) fast tokenizer over the tiny vocabulary, with an eos token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"</s>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "t0"})
    )


def model_dir(path: Path, kind: str = "qwen2", seed: int = 0, tokenizer: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tiny_model(kind, seed).save_pretrained(str(path))
    if tokenizer:
        write_tokenizer(path)
    return path


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _step(uid, traj, k, ids, mask, reward, adv=None) -> StepRecord:
    return StepRecord(uid, traj, k, list(ids), list(mask), [0.0] * len(ids), float(reward), adv)


def k_samples(rng: random.Random, uid: str = "p0", k: int = 6, prompt_len: int = 12) -> list[StepRecord]:
    """K samples of one prompt; two responses share their first tokens (trained, shared)."""
    prompt = _toks(rng, prompt_len)
    shared = _toks(rng, 3)
    out = []
    for i in range(k):
        resp = (shared if i < 2 else []) + _toks(rng, rng.randrange(3, 10))
        out.append(_step(uid, f"t{i}", 0, prompt + resp, [0] * prompt_len + [1] * len(resp), rng.random()))
    return out


def multi_turn(rng: random.Random, uid: str = "m0", trajs: int = 3, turns: int = 3) -> list[StepRecord]:
    """Trajectories whose step k+1 extends step k (tool output untrained); per-step advantages."""
    prompt = _toks(rng, 10)
    out = []
    for t in range(trajs):
        ids, mask = list(prompt), [0] * len(prompt)
        for k in range(turns):
            if k:
                tool = _toks(rng, 3)
                ids, mask = ids + tool, [0] * (len(mask) + len(tool))
            else:
                mask = [0] * len(mask)
            resp = _toks(rng, rng.randrange(2, 7))
            ids, mask = ids + resp, mask + [1] * len(resp)
            out.append(_step(uid, f"t{t}", k, ids, mask, rng.random(), adv=rng.uniform(-1, 1)))
    return out


def duplicates(rng: random.Random, uid: str = "d0") -> list[StepRecord]:
    """Identical token sequences as different trajectories, some with different rewards."""
    prompt, a, b = _toks(rng, 8), _toks(rng, 6), _toks(rng, 5)
    m = lambda r: [0] * 8 + [1] * len(r)  # noqa: E731
    return [
        _step(uid, "t0", 0, prompt + a, m(a), 1.0),
        _step(uid, "t1", 0, prompt + a, m(a), 0.0),
        _step(uid, "t2", 0, prompt + a, m(a), 1.0),
        _step(uid, "t3", 0, prompt + b, m(b), 0.0),
    ]


def many_groups(rng: random.Random) -> list[StepRecord]:
    return [s for g in range(4) for s in k_samples(rng, f"g{g}", k=3, prompt_len=6)]


def big_group(rng: random.Random) -> list[StepRecord]:
    return k_samples(rng, "big", k=8, prompt_len=10)


# name -> (builder, max_tokens for packing)
SCENARIOS = {
    "k_samples": (k_samples, 4096),
    "multi_turn": (multi_turn, 4096),
    "duplicates": (duplicates, 4096),
    "many_groups_per_row": (many_groups, 4096),
    "group_split_across_rows": (big_group, 40),
}


def fill_old_logprobs(model, steps: list[StepRecord], seed: int = 0, noise: float = 0.3) -> None:
    """old_logprobs = the model's own log-probs plus noise, so some ratios clip."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for s in steps:
            ids = torch.tensor([s.input_ids])
            lp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
            jitter = (torch.rand(lp.shape, generator=g) * 2 - 1) * noise
            vals = [0.0] + (lp + jitter).tolist()
            s.old_logprobs = [v if m else 0.0 for v, m in zip(vals, s.loss_mask)]


def scenario(name: str, model_path: Path, seed: int = 0) -> list[StepRecord]:
    from transformers import AutoModelForCausalLM

    build, _ = SCENARIOS[name]
    steps = build(random.Random(seed))
    model = AutoModelForCausalLM.from_pretrained(str(model_path)).float().eval()
    fill_old_logprobs(model, steps, seed)
    return steps


def write_pool(steps: list[StepRecord], pool: Path) -> Path:
    with PoolWriter(pool / "steps.jsonl") as w:
        for s in steps:
            w.write(s)
    return pool


def pack_pool(pool: Path, out: Path, max_tokens: int, pad_to: int = 16) -> Path:
    """Real `srt pack` (the command, in-process) -> shards on disk."""
    from click.testing import CliRunner

    from srtcli.cli import cli

    r = CliRunner().invoke(cli, ["pack", "--steps", str(pool), "--out", str(out),
                                 "--max-tokens", str(max_tokens), "--pad-to", str(pad_to)])
    assert r.exit_code == 0, r.output
    return out


def load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").float().eval()


def grads(model_path: Path, rows, cfg: LossConfig, micro: int = 0, ref_path: Path | None = None,
          info: DistInfo | None = None, attn: str = "sdpa", checkpointed: bool = False,
          compute_dtype: torch.dtype | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    """(global loss, gradients) of one optimizer step over `rows`, from the weights on disk, on
    `info.device` (default: a single process on DEVICE), the policy's layers checkpointed if
    asked, its forwards under autocast to `compute_dtype` if given; the gradients come back on
    the CPU."""
    info = info or DistInfo(device=DEVICE)
    model = load(model_path).to(info.device)
    if checkpointed:
        from attention.checkpointing import checkpoint_layers

        checkpoint_layers(model)
    ref = load(ref_path).to(info.device).requires_grad_(False) if ref_path is not None else None
    res = step_gradients(model, ref, rows, cfg, micro, info, attn, compute_dtype=compute_dtype)
    return res.stats.loss, {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
                            if p.grad is not None}


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest per-parameter ||a - b|| / ||b||."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-30)) for k in b)
