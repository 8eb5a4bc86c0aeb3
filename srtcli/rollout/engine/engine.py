"""Batched speculative generation for any HF causal LM: a per-slot KV cache, ragged acceptance,
continuous batching.

How the pieces fit:

- The KV cache and attention live in `srtcli.rollout.engine.slot_cache`: `SlotKVCache` keeps per-layer
  buffers [slots, kv_heads, L+1, D] in which each slot (one sequence) has its own valid length;
  rolling back rejected draft positions is just not counting them (they are overwritten later
  and never visible meanwhile: `Forwards._mask`). Column L is a trash column for padding queries.
- The forwards live in `srtcli.rollout.engine.forward` (the `Forwards` mixin): packed ([1, T] real tokens
  only, our `srt_slots` attention laying queries out per row) when left-padding would cost at
  least `PACK_MIN_PADDING` tokens or a row carries a draft tree, else padded. Both give
  bit-identical outputs (same seeds, same pools).
- A row's input is its *pending* tokens (the last emitted token, a whole prompt for a fresh
  slot, or tool output) followed by its draft. One forward gives the shaped target distribution
  at every draft position; `srtcli.rollout.engine.verify` accepts a prefix and emits one more token.
- `Engine.step()` drafts for every live slot, runs one forward per bucket (decode rows and
  long prefill rows are separate so a long prompt does not pad every decode row), verifies,
  applies the stop rules (EOS, max tokens, a tool stop via `stop_fn`), and frees finished
  slots. The caller refills free slots with `admit` (continuous batching) and may `drop`
  run-ahead slots.
- Prefix sharing: the K samples of a prompt prefill it once (`_share_prompts`); the others
  copy its KV and sample their first token from the kept distribution after the prompt.
- Adaptive draft length per sequence (`_adapt`), from past outcomes only.
- Tree drafts (`Proposal.parents`, srtcli/rollout/engine/tree_verify.py): the nodes follow the pending tokens,
  each at the position of its depth and seeing only its ancestors (always a packed forward);
  verification walks one draw from p per node, and the accepted nodes' KV moves to the
  columns a chain of them would have had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from srtcli.rollout.drafters import Drafter, Proposal
from srtcli.rollout.engine.sampling import SamplingParams, sample
from srtcli.rollout.engine.forward import Forwards
from srtcli.rollout.engine.kv_memory import check_kv_fits
# SlotKVCache is also imported from here by callers (`from srtcli.rollout.engine.engine import SlotKVCache`)
from srtcli.rollout.engine.slot_cache import SlotKVCache
from srtcli.rollout.engine.tree_verify import accepted_moves, walk_tree
from srtcli.rollout.engine.verify import verify_drafts


@dataclass
class Sequence:
    """One trajectory being generated (a sample of a prompt, or a run-ahead continuation)."""

    prompt_ids: list[int]
    max_new_tokens: int
    group: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    runahead: bool = False
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn
    turn_start: int = 0
    cache_len: int = 0
    generated: int = 0
    finish_reason: str | None = None
    slot: int = -1
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    spec_len: int = -1  # adaptive draft length (engine-managed; -1 = not started)
    drafter_state: Any = None

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)
            self.logprobs = [0.0] * len(self.tokens)
            self.mask = [0] * len(self.tokens)
        self.turn_start = len(self.tokens)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]


@dataclass
class EngineStats:
    """Counters over real (not run-ahead) rows unless named otherwise."""

    forwards: int = 0  # model forward calls that carried at least one real row
    all_forwards: int = 0
    row_forwards: int = 0  # (sequence, forward) pairs
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    runahead_tokens: int = 0
    model_s: float = 0.0  # wall seconds inside the model's forward (CUDA: synchronised)


StopFn = Callable[[Sequence, list[int]], "int | None"]
TurnEndFn = Callable[[Sequence], "list[int] | None"]


class Engine(Forwards):
    """Speculative batched generation over a fixed number of slots."""

    def __init__(
        self,
        model: torch.nn.Module,
        params: SamplingParams,
        drafter: Drafter,
        slots: int = 8,
        budget: int = 8,
        max_len: int = 1024,
        eos_ids: set[int] | frozenset[int] = frozenset(),
        seed: int = 0,
        stop_fn: StopFn | None = None,
        turn_end: TurnEndFn | None = None,
        adaptive: bool = True,
    ):
        self.model, self.params, self.drafter = model, params, drafter
        self.budget, self.max_len, self.eos_ids = budget, max_len, set(eos_ids)
        self.stop_fn, self.turn_end, self.adaptive = stop_fn, turn_end, adaptive
        self.device = next(model.parameters()).device
        # our attention function only while the engine runs the model (the model stays as given)
        self._attn = "srt_slots" if model.config._attn_implementation in ("sdpa", "eager") else None
        self.dtype = next(model.parameters()).dtype
        check_kv_fits(model, slots, max_len)  # before the cache grows to that size
        self.cache = SlotKVCache(slots, max_len)
        self.slots: list[Sequence | None] = [None] * slots
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.stats = EngineStats()
        # prompt -> (p after it, sequences whose slots hold its KV): see _share_prompts
        self._prompts: dict[tuple, tuple[torch.Tensor, list[Sequence]]] = {}

    # -- slots ---------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(s is None for s in self.slots)

    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]

    def admit(self, seq: Sequence) -> None:
        """Put a sequence in a free slot; its prompt is prefilled by the next step."""
        slot = self.slots.index(None)
        if len(seq.tokens) >= self.max_len:
            raise ValueError(f"sequence of {len(seq.tokens)} tokens does not fit max_len {self.max_len}")
        seq.slot, seq.cache_len = slot, 0
        self.slots[slot] = seq
        self.drafter.begin(seq)

    def drop(self, seq: Sequence) -> None:
        """Free a slot now (run-ahead work that is no longer wanted)."""
        if seq.finish_reason is None:
            seq.finish_reason = "dropped"
        self._release(seq)

    # -- one step ------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Draft, verify and extend every live slot once; returns the sequences that finished."""
        rows = self.active()
        if not rows:
            return []
        rows, followers = self._share_prompts(rows)
        props = [self._propose(s) for s in rows]
        # short pending runs (a tool result) ride with the decode rows; only long ones (a fresh
        # prompt) get their own forward, so they do not pad every decode row
        short = max(8, self.budget + 1)
        decode = [i for i, s in enumerate(rows) if len(s.tokens) - s.cache_len <= short]
        prefill = [i for i, s in enumerate(rows) if len(s.tokens) - s.cache_len > short]
        done: list[Sequence] = []
        for bucket in (decode, prefill):
            if bucket:
                done += self._run([rows[i] for i in bucket], [props[i] for i in bucket])
        for seq, key in followers:
            if self._follow(seq, key):
                done.append(seq)
        return done

    def _share_prompts(self, rows: list[Sequence]) -> tuple[list[Sequence], list[tuple[Sequence, tuple]]]:
        """Prefix sharing for the K samples of a prompt: a fresh sequence whose prompt is already
        in another live slot's cache (or is being prefilled this step) skips its own prefill. It
        copies that slot's prompt KV and samples its first token from the distribution after
        the prompt, which was computed once (`_prompts`). Exact: same tokens, same positions."""
        run, followers, leading = [], [], set()
        for seq in rows:
            if seq.cache_len == 0 and len(seq.tokens) > 1:
                key = tuple(seq.tokens)
                if key in leading or self._donor(key) is not None:
                    followers.append((seq, key))
                    continue
                leading.add(key)
            run.append(seq)
        return run, followers

    def _donor(self, key: tuple) -> Sequence | None:
        entry = self._prompts.get(key)
        if entry is None:
            return None
        live = [s for s in entry[1] if s.slot >= 0 and self.slots[s.slot] is s and s.cache_len >= len(key)]
        if not live:
            del self._prompts[key]
            return None
        entry[1][:] = live
        return live[0]

    def _follow(self, seq: Sequence, key: tuple) -> bool:
        donor = self._donor(key)
        if donor is None:  # the leader finished at once and gave its slot back: prefill later
            return False
        self.cache.copy_prefix(donor.slot, seq.slot, len(key))
        p0 = self._prompts[key][0]
        tok = int(sample(p0, self.gen))
        lp = float(p0[tok].clamp_min(1e-38).log())
        self._prompts[key][1].append(seq)
        return self._apply(seq, 0, 0, [tok], [lp])

    def _propose(self, seq: Sequence) -> Proposal:
        pending = len(seq.tokens) - seq.cache_len
        room = min(
            self.budget,
            seq.max_new_tokens - seq.generated - 1,
            self.max_len - seq.cache_len - pending - 1,
        )
        if self.adaptive:
            if seq.spec_len < 0:
                seq.spec_len = self.budget
            room = min(room, seq.spec_len)
        if room <= 0:
            return Proposal([])
        prop = self.drafter.propose(seq, room)
        return prop.truncate(room)

    def _adapt(self, seq: Sequence, drafted: int, a: int, tree: bool = False) -> None:
        """Next draft length from this step's outcome: grow after a fully accepted draft,
        shrink to what was accepted (+1) after a rejection. It depends only on past outcomes,
        so verification stays exact; on a compute-bound device it stops paying for tokens
        that keep being rejected."""
        if not self.adaptive or drafted == 0 or tree:  # a tree is never wholly accepted
            return
        seq.spec_len = min(self.budget, seq.spec_len + 2) if a == drafted else max(1, a + 1)

    def _run(self, rows: list[Sequence], props: list[Proposal]) -> list[Sequence]:
        p = self._forward(rows, props)
        for r, s in enumerate(rows):
            if s.cache_len == 0:  # a prefill: remember p after this prompt for prefix sharing
                self._prompts[tuple(s.tokens)] = (p[r, 0], [s])
        if any(pr.parents is not None for pr in props):
            return self._verify_trees(rows, props, p)
        b, kk, vocab = p.shape
        n = kk - 1
        draft = torch.zeros((b, max(n, 1)), dtype=torch.long)
        dlen = torch.tensor([len(pr.tokens) for pr in props], dtype=torch.long)
        sampled = torch.tensor([pr.q is not None and len(pr.tokens) > 0 for pr in props])
        q_tok = q_dist = None
        if n > 0:
            draft = torch.tensor([pr.tokens + [0] * (n - len(pr.tokens)) for pr in props], dtype=torch.long)
        if bool(sampled.any()):
            q_tok = torch.tensor([(pr.q or []) + [1.0] * (max(n, 1) - len(pr.q or [])) for pr in props])
            q_tok = q_tok.to(self.device)

            def q_at(at: list[int]) -> torch.Tensor:
                """Each sampled row's proposal distribution at its rejection position."""
                ri, ti, vals = [], [], []
                for r, (pr, k) in enumerate(zip(props, at)):
                    if pr.q is not None and k < len(pr.tokens):
                        dist = pr.dists[k]
                        ri += [r] * len(dist)
                        ti += dist.keys()
                        vals += dist.values()
                q = torch.zeros((b, vocab))
                q[ri, ti] = torch.tensor(vals)
                return q.to(self.device)

            q_dist = q_at
        draft, dlen, sampled = draft.to(self.device), dlen.to(self.device), sampled.to(self.device)
        v = verify_drafts(p, draft[:, :n], dlen, self.gen, sampled, q_tok, q_dist)
        # emitted tokens per row: draft[:a] then the final one; their log-probs under p
        ar = torch.arange(kk, device=self.device)[None, :]
        padded = torch.cat([draft[:, :n], torch.zeros((b, 1), dtype=torch.long, device=self.device)], 1)
        emitted = torch.where(ar < v.accepted[:, None], padded, v.final[:, None])
        lps = p.gather(-1, emitted[..., None]).squeeze(-1).clamp_min(1e-38).log()
        acc, em, lp = v.accepted.tolist(), emitted.tolist(), lps.tolist()
        done = []
        for r, seq in enumerate(rows):
            a = acc[r]
            if self._apply(seq, len(props[r].tokens), a, em[r][: a + 1], lp[r][: a + 1]):
                done.append(seq)
        return done

    def _verify_trees(self, rows: list[Sequence], props: list[Proposal], p: torch.Tensor) -> list[Sequence]:
        """Walk every row's tree with one draw per node (srtcli/rollout/engine/tree_verify.py), move the
        accepted nodes' KV to consecutive columns, and apply the emitted tokens."""
        x = sample(p, self.gen).tolist()
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
            self.cache.move(*moves)
        lps = p[ri, ki, ti].clamp_min(1e-38).log().tolist()
        done, i = [], 0
        for r, (seq, pr, (path, final)) in enumerate(zip(rows, props, walks)):
            a = len(path)
            emitted = [pr.tokens[n] for n in path] + [final]
            if self._apply(seq, len(pr.tokens), a, emitted, lps[i: i + a + 1], tree=pr.parents is not None):
                done.append(seq)
            i += a + 1
        return done

    def _apply(self, seq: Sequence, drafted: int, a: int, emitted: list[int], lps: list[float],
               tree: bool = False) -> bool:
        """Append a row's emitted tokens, apply the stop rules; True if the sequence finished."""
        old_len = len(seq.tokens)
        kv_valid = old_len + a  # pending tokens and the accepted drafts now have KV
        cut, reason = len(emitted), None
        for i, t in enumerate(emitted):
            if t in self.eos_ids:
                cut, reason = i + 1, "stop"
                break
        if self.stop_fn is not None:
            c = self.stop_fn(seq, emitted[:cut])
            if c is not None:
                cut, reason = c, "tool"
        left = min(seq.max_new_tokens - seq.generated, self.max_len - old_len)
        if cut > left or (cut == left and reason is None):
            cut, reason = left, "length"
        seq.tokens += emitted[:cut]
        seq.logprobs += lps[:cut]
        seq.mask += [1] * cut
        seq.generated += cut
        seq.cache_len = min(kv_valid, len(seq.tokens))
        self._adapt(seq, drafted, a, tree)
        if not seq.runahead:
            seq.forwards += 1
            seq.drafted += drafted
            seq.accepted += min(a, drafted)
            st = self.stats
            st.row_forwards += 1
            st.emitted += cut
            st.drafted += drafted
            st.accepted += min(a, drafted)
        else:
            self.stats.runahead_tokens += cut
        if cut:
            self.drafter.extend(seq, emitted[:cut])
        if reason is None:
            return False
        seq.turns.append((seq.turn_start, len(seq.tokens)))
        if reason == "tool" and self.turn_end is not None:
            inject = self.turn_end(seq)
            room = self.max_len - len(seq.tokens) - 1
            if inject and len(inject) <= room and seq.generated < seq.max_new_tokens:
                seq.tokens += inject
                seq.logprobs += [0.0] * len(inject)
                seq.mask += [0] * len(inject)
                seq.turn_start = len(seq.tokens)
                self.drafter.extend(seq, inject)
                return False
            reason = "length" if inject else "stop"
        elif reason == "tool":
            reason = "stop"
        seq.finish_reason = reason
        self._release(seq)
        return True

    def _release(self, seq: Sequence) -> None:
        """Free the slot; forget the sequence as a prompt-KV donor (no leak on long runs)."""
        self.slots[seq.slot] = None
        key = tuple(seq.prompt_ids)
        entry = self._prompts.get(key)
        if entry is not None:
            entry[1][:] = [s for s in entry[1] if s is not seq]
            if not entry[1]:
                del self._prompts[key]
        self.drafter.end(seq)

    @property
    def accepted_per_forward(self) -> float:
        return self.stats.emitted / self.stats.row_forwards if self.stats.row_forwards else math.nan
