"""Token-tree verification: several candidate continuations checked in one forward.

A tree draft (`Proposal.parents` set) is a set of deterministic candidates: node i is token
`tokens[i]`, a child of node `parents[i]` (-1: of the row's last pending token); parents come
before their children. The engine lays the nodes out after the row's pending tokens, in that
order, each at the position of its depth and seeing only its ancestors (`tree_layout`), so one
forward gives p after every node.

Verification (`walk_tree`) is plain sampling walked down the tree: draw x from p at the root; if
x is one of the root's children, move to that child and draw again from p there; the first x
that is no child is the final token. Every emitted token is a draw from p after exactly the
tokens before it, so the output follows the policy's distribution whatever the tree holds (the
chain rule of the point-mass scheme in srtcli.rollout.engine.verify is the one-child case: accept x with
probability p(x)). A node is accepted with probability sum of p over the drafted children, more
than any single chain can get; the price is the extra positions in the forward. Greedy: x is
the argmax, so the output is plain greedy decoding's.

The draws at all nodes are made at once (`srtcli.rollout.engine.sampling.sample` over every position): each is
independent and used only if the walk reaches its node, which depends on earlier draws only.
After the walk the accepted nodes' keys/values are moved to consecutive cache columns
(`accepted_moves`); their positions already were the consecutive ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from srtcli.rollout.engine.sampling import sample


def depths(parents: list[int]) -> list[int]:
    """Depth of every node (1 for a child of the root)."""
    out: list[int] = []
    for par in parents:
        out.append(1 if par < 0 else out[par] + 1)
    return out


def tree_layout(start: int, pending: int, parents: list[int]) -> tuple[list[int], np.ndarray]:
    """For a row whose `pending` tokens begin at cache column `start`, followed by the tree's
    nodes (node i at column start + pending + i): the position id of every input token, and
    which nodes each node sees ([n, n] bool, `sees[i, m]`: m is i or one of its ancestors).
    The pending tokens and the cache before them are seen by every node."""
    base = start + pending
    pos = list(range(start, base)) + [base + d - 1 for d in depths(parents)]
    sees = np.zeros((len(parents), len(parents)), dtype=bool)
    for i, par in enumerate(parents):
        if par >= 0:
            sees[i] = sees[par]
        sees[i, i] = True
    return pos, sees


def walk_tree(x: list[int], tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """x[0] is the draw after the pending tokens, x[1 + i] the draw after node i. Returns the
    accepted nodes (root to leaf) and the final token."""
    kids: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        kids.setdefault(par, {})[tok] = i
    path, node = [], -1
    while True:
        tok = x[node + 1]
        nxt = kids.get(node, {}).get(tok)
        if nxt is None:
            return path, tok
        path.append(nxt)
        node = nxt


def accepted_moves(base: int, path: list[int]) -> list[tuple[int, int]]:
    """(from column, to column) for the accepted nodes that are not already where a chain of
    them would be (node path[j] to column base + j)."""
    return [(base + n, base + j) for j, n in enumerate(path) if n != j]


def mask_trees(rows: list[tuple[int, int, list[int] | None]], lay: Any, arow: list[int],
               mask: torch.Tensor) -> torch.Tensor:
    """For a packed forward (`srtcli.rollout.engine.kv_cache.layout` maps `lay`, input row r in
    attention row arow[r]) whose rows are (pending tokens, cache length, tree parents or None): hide in
    the additive `mask` (in place) the earlier nodes that are not ancestors, and return the
    position ids of all tokens, each node at the position of its depth."""
    posids = lay.flat.clone()
    hidden = torch.finfo(mask.dtype).min
    for r, (pending, start, parents) in enumerate(rows):
        if not parents:
            continue
        n = len(parents)
        pos, sees = tree_layout(start, pending, parents)
        first = int(lay.first[r])
        posids[first: first + len(pos)] = torch.tensor(pos)
        q0, c0 = int(lay.pad[arow[r]]) + pending, start + pending  # the first node's query and column
        block = torch.full((n, n), hidden, dtype=mask.dtype).masked_fill_(torch.from_numpy(sees), 0.0)
        mask[arow[r], 0, q0: q0 + n, c0: c0 + n] = block
    return posids


def verify_trees(p: torch.Tensor, rows: list[Any], props: list[Any], generator: torch.Generator,
                 cache: Any) -> list[tuple[int, list[int], list[float]]]:
    """Walk every row's proposal (a chain is the one-child tree) with one draw per node, move
    the accepted nodes' KV in `cache` to consecutive columns, and return per row the accepted
    node count, the emitted tokens and their log-probs under p."""
    x = sample(p, generator).tolist()
    walks = [walk_tree(x[r], pr.tokens, pr.parents or list(range(-1, len(pr.tokens) - 1)))
             for r, pr in enumerate(props)]
    ri, ki, ti, moves = [], [], [], ([], [], [])
    for r, (seq, pr, (path, final)) in enumerate(zip(rows, props, walks)):
        at = [0] + [1 + n for n in path]
        ri += [r] * len(at)
        ki += at
        ti += [pr.tokens[n] for n in path] + [final]
        base = len(seq.tokens)  # column of the row's first draft node
        for src, dst in accepted_moves(base, path):
            moves[0].append(seq.slot), moves[1].append(src), moves[2].append(dst)
    if moves[0]:
        cache.move(*moves)
    lps = p[ri, ki, ti].clamp_min(1e-38).log().tolist()
    out, i = [], 0
    for pr, (path, final) in zip(props, walks):
        a = len(path)
        out.append((a, [pr.tokens[n] for n in path] + [final], lps[i: i + a + 1]))
        i += a + 1
    return out
