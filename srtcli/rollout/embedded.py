"""srt's own engine as a rollout backend (`--engine embedded`, the default).

The model runs in this process (srtcli.rollout.engine: KV cache, ragged acceptance, continuous
batching) with a drafter from srtcli.rollout.drafters; srtcli.rollout.runahead schedules the
rollout batches and the long-tail run-ahead; tools run between a sample's turns, off the
engine's thread (srtcli.rollout.agent).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from srtcli.errors import SrtError
from srtcli.rollout.agent.setup import ToolOptions
from srtcli.rollout.config import TREE_ATTENTION, RolloutConfig
from srtcli.rollout.driver import BatchEnd, FinishedGroup
from srtcli.rollout.groups import GroupCollector
from srtcli.rollout.plan import Plan, admission_order, check_prompts_early
from srtcli.rollout.steps import sample_of
from srtcli.rollout.summary import Counts, Run


def resolve_device(opt: str) -> str:
    """--device auto|cpu|cuda -> the torch device type to run on."""
    import torch

    if opt == "cuda" and not torch.cuda.is_available():
        built = "no CUDA device is visible" if torch.version.cuda else "this torch is built without CUDA"
        raise SrtError(f"--device cuda: {built} (torch {torch.__version__}); use --device cpu or auto")
    return "cuda" if opt == "cuda" or (opt == "auto" and torch.cuda.is_available()) else "cpu"


def engine_slots(batch_size: int, per: int, todo: int, n_prompts: int, k: int, run_ahead: bool) -> int:
    """Engine slots: --batch-size, capped at what a rollout batch can use at once: K samples of
    each of its prompts, plus one run-ahead continuation per prompt run ahead for."""
    work = min(per, todo) * k
    ahead = min(per, n_prompts) if run_ahead else 0
    return max(1, min(batch_size, work + ahead))


def check_tree_attention(config: RolloutConfig, model: Any) -> None:
    """--draft-mode tree and --tail-nodes verify through the model's sdpa or eager attention only."""
    attn = model.config._attn_implementation
    if attn in TREE_ATTENTION:
        return
    if config.draft == "srt" and config.draft_mode == "tree":
        raise SrtError(f"--draft-mode tree needs the model's sdpa or eager attention, not {attn}")
    if config.tail_nodes:
        raise SrtError(f"--tail-nodes needs the model's sdpa or eager attention, not {attn} (0 turns tail trees off)")


def make_engine(model: Any, params: Any, drafter: Any, hooks: Any, *, slots: int, budget: int, max_len: int,
                eos_ids: set[int], seed: int, draft_length: str, tail_nodes: int) -> Any:
    """The embedded engine as every rollout path builds it (`srt rollout`, the TRL rollout
    function): `hooks`, an agent's tool hooks or None; `budget` 0 for plain decoding."""
    from srtcli.rollout.engine.engine import Engine

    return Engine(model, params, drafter, slots=slots, budget=budget, max_len=max_len, eos_ids=eos_ids,
                  seed=seed, stop_fn=hooks.stop if hooks is not None else None,
                  turn_end=hooks.turn_end if hooks is not None else None, draft_length=draft_length,
                  tail_nodes=tail_nodes)


class EmbeddedBackend:
    """The embedded engine behind the driver (srtcli.rollout.driver `Backend`). `drafter`, if
    given, is used instead of the one --draft names (a benchmark's outside baseline, one object
    kept across runs)."""

    drafts_here = True

    def __init__(self, device: str = "auto", drafter: Any = None):
        self.device = resolve_device(device)  # a missing GPU is one line before anything is written
        self.given_drafter = drafter
        self.drafter: Any = None
        self.engine: Any = None
        self.hooks: Any = None

    def load(self, config: RolloutConfig) -> tuple[Any, list]:
        import torch
        from transformers.utils import logging as hf_logging

        from srtcli.models import default_model_dir, load_model_and_tokenizer
        from srtcli.rollout.model_facts import context_length
        from srtcli.rollout.agent.setup import agent_for
        from srtcli.rollout.prompts import read_prompts

        hf_logging.disable_progress_bar()  # stdout/stderr carry our progress and summary only
        check_prompts_early(config)
        if config.threads:
            # small models on a busy CPU: extra intra-op threads spin and cost 100x (measured)
            torch.set_num_threads(config.threads)
        model, tok = load_model_and_tokenizer(config.model or default_model_dir())
        model.to(self.device)
        self.ctx = context_length(getattr(model.config, "max_position_embeddings", None), tok)
        self.ctx = min(self.ctx, config.max_context or self.ctx)  # prompts are checked against it too
        self.agent = agent_for(config.tool, tok)
        prompts = read_prompts(config.prompts_path, tok, self.ctx - 1, self.agent and self.agent.schemas)
        check_tree_attention(config, model)
        self.config, self.model, self.tok = config, model, tok
        self.device_type = next(model.parameters()).device.type
        return tok, prompts

    def check(self, pl: Plan) -> None:
        from srtcli.rollout.engine.kv_memory import check_kv_fits

        c = self.config
        self.run_ahead = c.run_ahead_on(self.device_type)
        self.slots = engine_slots(c.batch_size, pl.per, len(pl.todo), len(pl.prompts), c.k, self.run_ahead)
        room = self.agent.room(ToolOptions.of(c)) if self.agent else 64
        self.max_len = min(self.ctx, max(len(p.ids) for p in pl.prompts) + c.max_new_tokens + room)
        check_kv_fits(self.model, self.slots, self.max_len)  # before the cache dir is opened

    @contextmanager
    def running(self, pl: Plan, session: Any) -> Iterator[Iterator[FinishedGroup | BatchEnd]]:
        try:
            self._start(pl, session)
            yield self._events(pl)
        finally:
            if self.hooks is not None:
                self.hooks.close()
            if self.drafter is not None:
                self.drafter.close()

    def _start(self, pl: Plan, session: Any) -> None:
        from srtcli.rollout.engine.sampling import SamplingParams
        from srtcli.rollout.model_facts import eos_ids

        c, model = self.config, self.model
        self.drafter = self.given_drafter if self.given_drafter is not None else make_drafter_for(c, session)
        eos = eos_ids(self.tok, getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        if self.agent is not None:
            self.hooks = self.agent.hooks(self.tok, ToolOptions.of(c), {p.id: p.record for p in pl.prompts}, set(eos))
        self.engine = make_engine(model, SamplingParams(c.temperature, c.top_p, c.top_k), self.drafter, self.hooks,
                                  slots=self.slots, budget=c.budget if c.draft != "none" else 0,
                                  max_len=self.max_len, eos_ids=set(eos), seed=c.seed, draft_length=c.draft_length,
                                  tail_nodes=c.tail_trees(self.device_type, model.config._attn_implementation))

    def _events(self, pl: Plan) -> Iterator[FinishedGroup | BatchEnd]:
        from srtcli.rollout.runahead import RunAhead, run_batches

        c = self.config
        index = {pl.uids[i]: i for i in pl.todo}
        groups = GroupCollector(c.k)
        batches, upcoming = rollout_batches(c, pl)
        for seq in run_batches(self.engine, batches, upcoming,
                               RunAhead(self.run_ahead, window=max(pl.per, 1), tokens=c.run_ahead_tokens)):
            if isinstance(seq, int):
                yield BatchEnd()
                continue
            group = groups.add(seq)
            if group is None:
                continue
            rewards = [self.hooks.finish(s) if self.hooks else None for s in group]
            yield FinishedGroup(index[seq.group], [sample_of(s, self.tok, r) for s, r in zip(group, rewards)])
            self.drafter.group_done(seq.group)

    def report(self, run: Run) -> tuple[Counts, dict]:
        st, ds = self.engine.stats, self.drafter.stats()
        counts = Counts(st.emitted, st.forwards, st.row_forwards, st.drafted, st.accepted, st.runahead_tokens,
                        ds["cache_hit_rate"] if "cache_hit_rate" in ds else None)
        return counts, {"model_s": round(st.model_s, 3), "cpu_s": round(run.cpu, 3)}

    def shutdown(self) -> None:
        pass  # the model is an ordinary object of this process


def rollout_batches(c: RolloutConfig, pl: Plan) -> tuple[list, list]:
    """The engine's sequences of each rollout batch (K per prompt, in `admission_order`), and the
    prompts each batch runs ahead for: the next batch's, or after the last batch the file's
    first (the next epoch's)."""
    from srtcli.rollout.engine.sequence import Sequence
    from srtcli.rollout.runahead import Upcoming

    chunks, prompts, uids = pl.chunks, pl.prompts, pl.uids
    batches = [[Sequence(prompts[i].ids, c.max_new_tokens, group=uids[i],
                         meta={"prompt_id": prompts[i].id, "sample": s})
                for i, s in admission_order(chunk, c.k, c.admission)] for chunk in chunks]
    nxt = [chunks[b + 1] if b + 1 < len(chunks) else list(range(len(prompts))) for b in range(len(chunks))]
    return batches, [[Upcoming(uids[i], prompts[i].ids) for i in n] for n in nxt]


def make_drafter_for(c: RolloutConfig, session: Any) -> Any:
    """The drafter --draft names (srt: over the run's tree session `session`)."""
    from srtcli.rollout.drafters import make_drafter

    if c.draft == "srt":
        return make_drafter("srt", session=session, min_prob=c.min_prob, mode=c.draft_mode, seed=c.seed,
                            stop=c.draft_stop, record_probs=c.temperature > 0)
    return make_drafter(c.draft)
