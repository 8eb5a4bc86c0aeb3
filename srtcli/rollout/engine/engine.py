"""Batched speculative generation for any HF causal LM: a per-slot KV cache, ragged acceptance,
continuous batching.

How the pieces fit:

- The KV cache and attention live in `srtcli.rollout.engine.kv_cache`: `SlotKVCache` keeps
  per-layer buffers [slots, kv_heads, L+1, D] in which each slot (one sequence) has its own
  valid length; rolling back rejected draft positions is just not counting them (they are
  overwritten later and never visible meanwhile: the forward's mask hides them). Column L is a
  trash column for padding queries.
- The forwards are the engine's `ForwardPass` (`srtcli.rollout.engine.forward`): packed ([1, T]
  real tokens only, our `srt_slots` attention laying queries out per row) when left-padding
  would cost at least `PACK_MIN_PADDING` tokens or a row carries a draft tree, else padded.
  Both give bit-identical outputs (same seeds, same pools).
- A row's input is its *pending* tokens (the last emitted token, a whole prompt for a fresh
  slot, or tool output) followed by its draft. One forward gives the target's logits at every
  draft position; `srtcli.rollout.engine.verify` accepts a prefix and emits one more token.
- `Engine.step()` drafts for every live slot, runs one forward per bucket (decode rows and
  long prefill rows are separate so a long prompt does not pad every decode row), verifies,
  applies the stop rules (`srtcli.rollout.engine.stops`: EOS, max tokens, a tool stop via
  `stop_fn`), and frees finished slots. The caller refills free slots with `admit`
  (continuous batching) and may `drop` run-ahead slots.
- Prefix sharing: the K samples of a prompt prefill it once (`_share_prompts`); the others
  copy its KV and sample their first token from the kept distribution after the prompt.
- Tool calls (`turn_end`) may hand back output that is not ready (`Pending`): the row keeps its
  slot and KV cache but sits out of the forwards until `step` finds the output ready.
- How much of each draft is verified (`draft_length`): by default the cost rule
  (`srtcli.rollout.engine.draft_cost`): every decode row drafts the whole budget and the step
  keeps the tokens expected to save time, judged by the engine's own timed forwards and the
  verdicts of earlier drafts; a step where no token could pay drafts nothing. Or the adaptive
  length per sequence (`srtcli.rollout.drafters.draft_length`, from past outcomes only, the
  whole budget in the long tail), or always the whole budget (`fixed`).
- The target's distributions are read only where verification needs them
  (`srtcli.rollout.engine.target.Target`): p(x) of each draft token, one whole distribution
  per row.
- Tree drafts (`Proposal.parents`, `srtcli.rollout.engine.tree_verify`): the nodes follow the
  pending tokens, each at the position of its depth and seeing only its ancestors (always a
  packed forward); verification walks one draw from p per node, and the accepted nodes' KV
  moves to the columns a chain of them would have had.
- Tail trees (`tail_nodes`): a step never verifies more positions than a full batch of chains
  would (slots x (1 + budget), and at most TAIL_POSITIONS). When fewer rows run, as in the
  long tail where a rollout batch waits for its longest samples, the free positions go to the
  rows still running: each drafts a tree (`Drafter.propose_tree`) of its share, up to
  `tail_nodes` nodes. Exact like any tree.
"""

from __future__ import annotations

import math
import time

import torch

from srtcli.rollout.drafters.base import Drafter, Proposal
from srtcli.rollout.drafters.draft_length import DRAFT_LENGTHS, in_the_tail, next_draft_length
from srtcli.rollout.engine.draft_cost import DraftCost
from srtcli.rollout.engine.forward import ForwardPass
from srtcli.rollout.engine.kv_memory import check_kv_fits
from srtcli.rollout.engine.sampling import SamplingParams, sample
from srtcli.rollout.engine.sequence import EngineStats, Sequence, StopFn, TurnEndFn
from srtcli.rollout.engine.kv_cache import SlotKVCache, register_slot_attention
from srtcli.rollout.engine.stops import WAIT_S, append_generated, cut_emitted, end_turn, take_tool_output
from srtcli.rollout.engine.tree_verify import verify_trees
from srtcli.rollout.engine.verify import verify_chains


# the most positions a step's tail trees fill: past a few hundred tokens a GPU forward is
# compute-bound (bf16 peak FLOPs over memory bandwidth is ~200 tokens on an H100 or H200), so
# a tree beyond that would cost more than the forward it saves
TAIL_POSITIONS = 512


class Engine:
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
        draft_length: str = "cost",
        tail_nodes: int = 0,
    ):
        if draft_length not in DRAFT_LENGTHS:
            raise ValueError(f"draft_length must be one of {', '.join(DRAFT_LENGTHS)}")
        self.drafter = drafter
        self.budget, self.max_len, self.eos_ids = budget, max_len, set(eos_ids)
        self.stop_fn, self.turn_end = stop_fn, turn_end
        self.adaptive = draft_length == "adaptive"
        # the cost rule: draft what is expected to save time, measured as the engine runs
        self.draft_cost = DraftCost() if draft_length == "cost" and budget > 0 else None
        self.tail_nodes = tail_nodes
        self.device = next(model.parameters()).device
        register_slot_attention()
        check_kv_fits(model, slots, max_len)  # before the cache grows to that size
        self.kv_cache = SlotKVCache(slots, max_len)
        self.slots: list[Sequence | None] = [None] * slots
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.stats = EngineStats()
        self.forward_pass = ForwardPass(model, params, self.kv_cache, slots, self.device,
                                        next(model.parameters()).dtype, max_len, self.stats)
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
        """Draft, verify and extend every live slot once; returns the sequences that finished.
        Rows waiting for tool output sit out (their KV stays) until it is ready; when every live
        row waits, the step blocks briefly for the first result instead."""
        done = self._resume_waiting()
        rows = [s for s in self.active() if s.pending is None]
        if not rows:
            waiting = self.active()
            if waiting and not done:
                waiting[0].pending.wait(WAIT_S)
            return done
        rows, followers = self._share_prompts(rows)
        nodes = self._tree_nodes(len(rows))
        tail = in_the_tail(len(rows), len(self.slots))
        # short pending runs (a tool result) ride with the decode rows; only long ones (a fresh
        # prompt) get their own forward, so they do not pad every decode row
        short = max(8, self.budget + 1)
        decode = [s for s in rows if len(s.tokens) - s.cache_len <= short]
        prefill = [s for s in rows if len(s.tokens) - s.cache_len > short]
        if decode:
            done += self._run(decode, self._proposals(decode, nodes, tail), timed=True)
        if prefill:
            # a prompt's first draft would ride on its prefill, whose cost the rule does not model
            props = [Proposal([]) if self.draft_cost else self._propose(s, nodes, tail) for s in prefill]
            done += self._run(prefill, props)
        return done + self._follow(followers)

    def _proposals(self, rows: list[Sequence], nodes: int, tail: bool) -> list[Proposal]:
        """Each decode row's draft: under the cost rule the whole budget, cut to what is expected
        to save time (`DraftCost`), and nothing at all when no draft could; else the adaptive
        or fixed length (`_propose`)."""
        if self.draft_cost is None:
            return [self._propose(s, nodes, tail) for s in rows]
        tokens, context = sum(len(s.tokens) - s.cache_len for s in rows), max(len(s.tokens) for s in rows)
        if not self.draft_cost.worth_drafting(len(rows), tokens, context):
            return [Proposal([]) for _ in rows]
        props = [self._propose(s, nodes, tail=True) for s in rows]
        chains = [r for r, pr in enumerate(props) if pr.parents is None]  # trees keep their nodes
        cuts = self.draft_cost.cut(len(rows), tokens, context, [confidences(props[r]) for r in chains])
        for r, n in zip(chains, cuts):
            props[r] = props[r].truncate(n)
        return props

    def _resume_waiting(self) -> list[Sequence]:
        """Rows whose tool output is ready take it and re-enter; those it ends are finished."""
        done = []
        for seq in self.active():
            ready, reason = take_tool_output(seq, self.max_len, self.drafter) if seq.pending is not None \
                else (False, None)
            if ready and reason is not None:
                seq.finish_reason = reason
                self._release(seq)
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

    def _follow(self, followers: list[tuple[Sequence, tuple]]) -> list[Sequence]:
        """Start this step's followers whose prompt is still in a live slot's cache (a leader that
        finished at once gave its slot back: those prefill later); returns those that finished.
        Their donors are found, and their prompt KV copied, before any of them starts, and
        their first tokens are drawn in one batch."""
        ready = [(seq, key, donor) for seq, key in followers if (donor := self._donor(key)) is not None]
        if not ready:
            return []
        copies: dict[tuple[int, int], list[int]] = {}
        for seq, key, donor in ready:
            copies.setdefault((donor.slot, len(key)), []).append(seq.slot)
        for (src, n), dst in copies.items():
            self.kv_cache.copy_prefix(src, dst, n)
        p0 = torch.stack([self._prompts[key][0] for _, key, _ in ready])
        toks = sample(p0, self.gen)
        lps = p0.gather(1, toks[:, None]).clamp_min(1e-38).log().view(-1).tolist()
        done = []
        for (seq, key, _), tok, lp in zip(ready, toks.tolist(), lps):
            self._prompts[key][1].append(seq)
            if self._apply(seq, 0, 0, [tok], [lp]):
                done.append(seq)
        return done

    def _tree_nodes(self, rows: int) -> int:
        """Nodes each row's draft tree may have this step: its share of a full batch's positions
        (at most TAIL_POSITIONS), up to `tail_nodes`; 0 (draft chains) while that share is no
        more than a chain's."""
        share = min(len(self.slots) * (1 + self.budget), TAIL_POSITIONS) // max(rows, 1) - 1
        return min(self.tail_nodes, share) if self.tail_nodes and share > self.budget else 0

    def _propose(self, seq: Sequence, nodes: int = 0, tail: bool = False) -> Proposal:
        """A draft tree of `nodes` nodes if asked, else a chain: the whole budget in the long
        `tail`, else at most the sequence's adaptive length."""
        pending = len(seq.tokens) - seq.cache_len
        left = min(seq.max_new_tokens - seq.generated - 1, self.max_len - seq.cache_len - pending - 1)
        nodes = min(nodes, left)  # a tree's depth never passes what the sequence may still take
        tree = self.drafter.propose_tree(seq, nodes) if nodes > 0 else None
        if tree is not None:
            return tree.truncate(nodes)
        room = min(self.budget, left)
        if self.adaptive:
            if seq.spec_len < 0:
                seq.spec_len = self.budget
            if not tail:
                room = min(room, seq.spec_len)
        if room <= 0:
            return Proposal([])
        prop = self.drafter.propose(seq, room)
        return prop.truncate(room)

    def _adapt(self, seq: Sequence, drafted: int, a: int, tree: bool = False) -> None:
        """Next draft length from this step's outcome (`next_draft_length`)."""
        if not self.adaptive or drafted == 0 or tree:  # a tree is never wholly accepted
            return
        seq.spec_len = next_draft_length(seq.spec_len, self.budget, drafted, a)

    def _run(self, rows: list[Sequence], props: list[Proposal], timed: bool = False) -> list[Sequence]:
        """One forward for `rows` and their drafts, verified and applied; the sequences that
        finished. A `timed` forward (decode rows) teaches the cost rule what its tokens cost."""
        t0 = time.perf_counter()
        target = self.forward_pass.run(rows, props)
        fresh = [r for r, s in enumerate(rows) if s.cache_len == 0]
        if fresh:  # prefills: remember p after each prompt for prefix sharing
            p0 = target.dists(torch.tensor([target.at(r, 0) for r in fresh], device=self.device))
            for r, p in zip(fresh, p0):
                self._prompts[tuple(rows[r].tokens)] = (p, [rows[r]])
        if any(pr.parents is not None for pr in props):
            keep = 1 + max(len(pr.tokens) for pr in props)
            verdicts = verify_trees(target.dense(keep), rows, props, self.gen, self.kv_cache)
        else:
            verdicts = list(zip(*verify_chains(target, props, self.gen, self.device)))
        if self.draft_cost is not None and timed:
            self._teach(rows, props, [v[0] for v in verdicts], time.perf_counter() - t0)
        done = []
        for seq, pr, (a, emitted, lps) in zip(rows, props, verdicts):
            if self._apply(seq, len(pr.tokens), a, emitted[: a + 1], lps[: a + 1], tree=pr.parents is not None):
                done.append(seq)
        return done

    def _teach(self, rows: list[Sequence], props: list[Proposal], accepted: list[int], seconds: float) -> None:
        """The cost rule learns this forward's seconds by its tokens and context, and its chains'
        verdicts (called before the rows take their emitted tokens)."""
        drafted = sum(len(pr.tokens) for pr in props)
        tokens = sum(len(s.tokens) - s.cache_len for s in rows) + drafted
        self.draft_cost.observe_forward(tokens, max(len(s.tokens) for s in rows), seconds, drafted)
        chains = [(confidences(pr), a) for pr, a in zip(props, accepted) if pr.parents is None]
        self.draft_cost.observe_verdicts([c for c, _ in chains], [a for _, a in chains])

    def _apply(self, seq: Sequence, drafted: int, a: int, emitted: list[int], lps: list[float],
               tree: bool = False) -> bool:
        """Append a row's emitted tokens, apply the stop rules; True if the sequence finished."""
        kv_valid = len(seq.tokens) + a  # pending tokens and the accepted drafts now have KV
        cut, reason = cut_emitted(seq, emitted, self.eos_ids, self.stop_fn, self.max_len)
        append_generated(seq, emitted, lps, cut)
        seq.cache_len = min(kv_valid, len(seq.tokens))
        self._adapt(seq, drafted, a, tree)
        self.stats.record(seq, drafted, a, cut)
        if cut:
            self.drafter.extend(seq, emitted[:cut])
        if reason is None:
            return False
        reason = end_turn(seq, reason, self.turn_end, self.max_len, self.drafter)
        if reason is None:
            return False
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


def confidences(prop: Proposal) -> list[float]:
    """A chain's confidence per position (a drawn stop's too); 1 where its drafter gives none."""
    return prop.conf if prop.conf is not None else [1.0] * len(prop.dists or prop.tokens)
