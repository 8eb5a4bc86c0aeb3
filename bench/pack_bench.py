"""Prefix-tree packing benchmark: build throughput, token ratios, and forward(+backward) time.

    .venv/bin/python bench/pack_bench.py [--repeats 3] [--skip-timing]

1. Throughput of `PrefixTree.build(...).pack()` and `pack_rows` on groups of 16 sequences of
   2,000 tokens (a 1,000-token shared prompt + 1,000-token responses).
2. Token ratios of the packing design's three scenarios (n steps / prefix / branch), both as
   independent branches (n samples of one prompt) and as multi-turn extension (step k+1 extends
   step k by one more branch), next to the figures that design claimed.
3. Time of one forward and one forward+backward of a small random Qwen2 on the same sequences:
   the packed row (tree attention, SDPA bool mask), separate per-sequence forwards, and one
   right-padded batch, measured side by side in this run; the time ratio is printed next to
   the token ratio. CPU only here: the CUDA FlexAttention comparison needs a GPU.

Not a test: prints numbers; the machine may be shared, so take them as indicative.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from attention import PrefixTree, pack_rows, row_logprobs

SCENARIOS = [(4, 256, 128), (8, 1024, 256), (4, 1024, 128)]
SEED_CLAIM = {(4, 256, 128): 0.53, (8, 1024, 256): 0.35, (4, 1024, 128): 0.28}


def scenario(n: int, prefix: int, branch: int, multi_turn: bool, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    p = [rng.randrange(vocab) for _ in range(prefix)]
    if not multi_turn:
        return [p + [rng.randrange(vocab) for _ in range(branch)] for _ in range(n)]
    seqs, cur = [], list(p)
    for _ in range(n):
        cur = cur + [rng.randrange(vocab) for _ in range(branch)]
        seqs.append(list(cur))
    return seqs


def bench_throughput(reps: int) -> None:
    rng = random.Random(0)
    groups = []
    for _ in range(16):
        prompt = [rng.randrange(150_000) for _ in range(1000)]
        groups.append([prompt + [rng.randrange(150_000) for _ in range(1000)] for _ in range(16)])
    n = sum(len(s) for g in groups for s in g)
    for name, fn in (
        ("PrefixTree.build+pack", lambda: [PrefixTree.build(g).pack() for g in groups]),
        ("pack_rows (8192, pad 128)", lambda: pack_rows(groups, max_tokens=8192, pad_to=128)),
    ):
        best = min(_timed(fn) for _ in range(reps))
        print(f"  {name:28s} {n / best / 1e6:6.2f} M tokens/s  ({n} tokens in {best * 1e3:.1f} ms)")


def bench_ratios() -> None:
    print(f"  {'n/prefix/branch':16s} {'independent':>12s} {'multi-turn':>11s} {'seed claims':>12s}")
    for sc in SCENARIOS:
        ind = PrefixTree.build(scenario(*sc, False, 1000)).token_ratio()
        mt = PrefixTree.build(scenario(*sc, True, 1000)).token_ratio()
        print(f"  {'/'.join(map(str, sc)):16s} {ind:11.1%} {mt:11.1%} {SEED_CLAIM[sc]:11.0%}")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def small_qwen2(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=8192, attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(cfg).float()


def _plain_logprobs(model, ids: torch.Tensor, att: torch.Tensor | None) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits.float()
    lp = logits[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0]
    return lp if att is None else lp * att[:, 1:]


def ways(model, seqs: list[list[int]]):
    """name -> callable returning a scalar (sum of all log-probs) for each way of running."""
    row = pack_rows([seqs], max_tokens=1 << 20, pad_to=1)[0]
    width = max(map(len, seqs))
    padded = torch.zeros(len(seqs), width, dtype=torch.long)
    att = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
    return {
        "packed tree row": lambda: sum(x.sum() for x in row_logprobs(model, row, backend="sdpa")),
        "separate": lambda: sum(_plain_logprobs(model, torch.tensor([s]), None).sum() for s in seqs),
        "padded batch": lambda: _plain_logprobs(model, padded, att).sum(),
    }


def _measure(model, fns: dict, reps: int) -> dict[str, tuple[float, float]]:
    """Best-of-`reps` fwd and fwd+bwd seconds per way, rounds interleaved so that load from
    other users of the machine hits every way alike; one warm-up call each first."""
    def fwd(fn):
        with torch.no_grad():
            fn()

    def both(fn):
        fn().backward()
        model.zero_grad(set_to_none=True)

    best = {name: [float("inf"), float("inf")] for name in fns}
    for name, fn in fns.items():
        fwd(fn)
    for _ in range(reps):
        for name, fn in fns.items():
            best[name][0] = min(best[name][0], _timed(lambda: fwd(fn)))
            best[name][1] = min(best[name][1], _timed(lambda: both(fn)))
    return {k: (v[0], v[1]) for k, v in best.items()}


def bench_timing(reps: int) -> None:
    vocab = 1000
    model = small_qwen2(vocab)
    print("  small Qwen2: hidden 128, 2 layers, 4 heads / 2 KV heads, vocab 1000, float32, CPU, SDPA")
    for multi in (False, True):
        for sc in SCENARIOS:
            seqs = scenario(*sc, multi, vocab)
            tree = PrefixTree.build(seqs)
            padded_ratio = len(seqs) * max(map(len, seqs)) / tree.original_tokens()
            label = f"{'/'.join(map(str, sc))} {'multi-turn' if multi else 'independent'}"
            print(f"  {label}: token ratio {tree.token_ratio():.1%} (padded batch holds {padded_ratio:.2f}x the tokens)")
            res = _measure(model, ways(model, seqs), reps)
            base_sep, base_pad = res["separate"], res["padded batch"]
            for name, (fwd, both) in res.items():
                print(
                    f"    {name:16s} fwd {fwd * 1e3:8.1f} ms  fwd+bwd {both * 1e3:8.1f} ms   "
                    f"vs separate {fwd / base_sep[0]:5.2f}x / {both / base_sep[1]:5.2f}x   "
                    f"vs padded {fwd / base_pad[0]:5.2f}x / {both / base_pad[1]:5.2f}x"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, CUDA {torch.cuda.is_available()}")
    print("1. pack throughput (16 groups x 16 sequences x 2,000 tokens)")
    bench_throughput(args.repeats)
    print("2. token ratio = packed / original tokens")
    bench_ratios()
    if not args.skip_timing:
        print("3. log-probs of all sequences: time (best of repeats) and ratio to the baselines, fwd / fwd+bwd")
        bench_timing(args.repeats)


if __name__ == "__main__":
    main()
