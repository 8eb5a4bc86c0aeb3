"""A/B of the SDPA tree backend's key selection, one packed row, forward + backward.

`old`: each query block reads the contiguous key range from its tree's root to itself.
`new` (attention/masks.py `sdpa_blocks`): it reads only keys whose subtree reaches the block,
skipping earlier sibling branches. Same row, same model, interleaved, CPU time, best of N.

    .venv/bin/python bench/attention_blocks_bench.py [--branches 8 --prefix 1024 --branch 256]
"""

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import attention.masks as masks
from attention import pack_rows, row_logprobs


def contiguous_blocks(subtree_end, position_ids=None, sliding_window=None, block=512):
    """The previous key selection: every key from the tree's root up to the block's end."""
    roots = masks.tree_roots(subtree_end)
    out = []
    for a in range(0, subtree_end.numel(), block):
        b = min(a + block, subtree_end.numel())
        lo = int(roots[a])
        q, k = torch.arange(a, b)[:, None], torch.arange(lo, b)[None, :]
        out.append((a, b, slice(lo, b), ((k <= q) & (q <= subtree_end[lo:b][None, :]))[None, None]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--branch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = Qwen2Config(vocab_size=2048, hidden_size=a.hidden, intermediate_size=a.hidden * 11 // 4,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192)
    model = Qwen2ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 2048, (a.prefix,), generator=g).tolist()
    seqs = [prefix + torch.randint(0, 2048, (a.branch,), generator=g).tolist() for _ in range(a.branches)]
    row = pack_rows([seqs], max_tokens=1 << 20)[0]
    variants = {"old": contiguous_blocks, "new": masks.sdpa_blocks}
    best = {}
    for _ in range(a.repeats):
        for name, fn in variants.items():
            masks_fn, masks.sdpa_blocks = masks.sdpa_blocks, fn
            t = time.process_time()
            sum(lp.sum() for lp in row_logprobs(model, row, backend="sdpa")).backward()
            best[name] = min(best.get(name, 1e9), time.process_time() - t)
            masks.sdpa_blocks = masks_fn
    print(f"{a.branches}/{a.prefix}/{a.branch}: old {best['old']:.3f}s  new {best['new']:.3f}s  "
          f"new/old {best['new'] / best['old']:.3f}")


if __name__ == "__main__":
    main()
