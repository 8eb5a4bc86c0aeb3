"""A `rollout_func` for TRL's `GRPOTrainer` that generates with srt's embedded engine.

    from srtcli.trl.rollout import srt_rollout_func
    rollout = srt_rollout_func(cache="cache")          # a directory, a redis:// URL, or None
    trainer = GRPOTrainer(model, reward_funcs, args=args, train_dataset=ds, rollout_func=rollout)
    trainer.train()                                    # the cache is closed when training ends

What TRL passes (TRL 1.16, `GRPOTrainer._generate`): `rollout_func(prompts, trainer)` gets the
`prompt` column of the process's generation batch as the dataloader gave it. The train sampler
(`RepeatSampler(mini_repeat_count=num_generations)`) repeats every prompt `num_generations` times
in a row, so `prompts` holds each prompt `num_generations` times (`num_generations_eval` in
evaluation), despite the docstring's "no duplication"; TRL then pairs the i-th completion with
`inputs[i]` (rewards, advantages per group). So this function returns exactly one completion per
entry of `prompts`, in order, and the entries with the same prompt (whatever their count and
place) are one srt group: one per-prompt token tree that their samples feed on the fly.

Each call builds an `Engine` (srtcli.rollout.engine) on `trainer.model` itself (unwrapped, no copy
of the weights), in eval mode under `torch.no_grad()` (the model's train mode is restored after),
with sampling taken from `trainer.args` (temperature, top_p, top_k; greedy when temperature is 0
or `generation_kwargs={"do_sample": False}`), `max_completion_length` new tokens and TRL's own eos
ids (`trainer.eos_token_ids`). Prompts are tokenized as TRL's generation does: conversational ones
with the processing class's chat template (`add_generation_prompt=True`, the trainer's
`chat_template`, `chat_template_kwargs`), plain strings as they are, and the engine is built as
`srt rollout` builds it (`embedded.make_engine`). The drafter (`draft="srt"`: srt's drafter over a
tree session, `srtcli.rollout.tree_session.TreeSession`, with `srt rollout`'s options and
defaults) and its session live across calls; groups are keyed by srt's prompt uid (the prompt's
ids and the tokenizer's fingerprint), as `srt rollout` keys them, so a cache written by
`srt rollout` and one written here serve each other. Each call is one rollout batch of the
session (appended, then the clock ticks); the session is closed by `close()` or at the end of
training (a callback added on the first call), and a later call opens it again.

`logprobs` are the natural log of the probability the engine sampled each completion token with
(the shaped distribution: after temperature, top-k and top-p, as vLLM's `processed_logprobs`
that TRL's importance-sampling correction expects; 0.0 for every token when greedy).

Tools: `tools=SPEC` takes what `srt rollout --tools` takes (`calculator`, `python`, `module:function`,
a list of functions, an environment class: srtcli.rollout.agent) and runs them between a sample's
turns exactly as `srt rollout` does (the chat template's call format, or the bundled model's
`<calc>` tags); the schemas go into conversational prompts' chat template. The completion is then
the whole trajectory after the prompt, tool output included, with `env_mask` 1 for the model's
tokens and 0 for tool output (whose `logprobs` are 0.0); `max_completion_length` counts the
model's tokens, as `--max-new-tokens` does. An environment with `get_reward` adds `env_reward`
(one float per completion) for the reward functions. Environment classes are made without
`reset` arguments (the rollout function sees prompts, not dataset rows).

Not supported (a ValueError names it): `min_p`, `repetition_penalty` other than 1, vision models,
sharded models (DeepSpeed ZeRO-3, FSDP), and TRL's own `tools`/`environment_factory` on the
trainer (pass srt's `tools=` here instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from cache_store.store import LOAD_TOKENS
from srtcli.rollout.drafters.base import Drafter

TRAINER_METRICS = ("accepted_per_forward", "draft_acceptance_rate", "cache_hit_rate")


def srt_rollout_func(cache: Any = None, *, budget: int = 8, draft: str | Drafter = "srt", slots: int = 64,
                     seed: int | None = None, draft_mode: str = "sample", min_prob: float = 0.1,
                     draft_length: str = "cost", tail_nodes: int = 0, shared_tree: bool = True,
                     draft_stop: bool = True, load_tokens: int = LOAD_TOKENS, tools: str | None = None,
                     max_turns: int | None = None, max_tool_tokens: int | None = None,
                     tool_timeout: float | None = None, tool_workers: int | None = None) -> SrtRollout:
    """A callable `f(prompts, trainer) -> dict` for `GRPOTrainer(rollout_func=f)`, with a `close()`.

    `cache`: the tree cache (a directory, a `redis://` URL, an open `TreeSession` whose owner
    closes it, or None: trees live for one call only, the run-wide tree across calls). `budget`: draft tokens per row and
    forward (0: plain decoding). `draft`: a drafter name (`srt`, `ngram`, `suffix`, `none`) or a
    `Drafter` object (used as is; its owner closes it). `slots`: engine rows at most. `seed`: the
    engine's sampling seed of the first call (the trainer's `args.seed` if None), plus one per
    call. `draft_length`: how many of the budget's tokens a row verifies, as `srt rollout
    --draft-length` (`cost`: those expected to save time). `draft_mode`, `min_prob`, `shared_tree`,
    `draft_stop`, `load_tokens`: the srt drafter's options, as `srt rollout`'s `--draft-mode`,
    `--min-prob`, `--shared-tree/--no-shared-tree`, `--draft-stop/--no-draft-stop` and
    `--load-tokens` (their defaults are that command's). `tools`: a `srt rollout --tools` spec (None: no tools); `max_turns`,
    `max_tool_tokens`, `tool_timeout`, `tool_workers`: as `srt rollout`'s options of those names
    (their defaults when None)."""
    return SrtRollout(cache, budget=budget, draft=draft, slots=slots, seed=seed, draft_mode=draft_mode,
                      min_prob=min_prob, draft_length=draft_length, tail_nodes=tail_nodes,
                      tree_options={"shared": shared_tree, "load_tokens": load_tokens}, draft_stop=draft_stop,
                      tools=tools,
                      max_turns=max_turns, max_tool_tokens=max_tool_tokens, tool_timeout=tool_timeout,
                      tool_workers=tool_workers)


class SrtRollout:
    """The rollout function object: the tree session and the drafter it keeps across calls, and
    the last call's counts (`last`: forwards, accepted per forward, cache hit rate, ...)."""

    def __init__(self, cache: Any, *, budget: int, draft: str | Drafter, slots: int, seed: int | None,
                 draft_mode: str, min_prob: float, draft_length: str, tail_nodes: int,
                 tree_options: dict[str, Any] | None = None, draft_stop: bool = True, tools: str | None = None,
                 max_turns: int | None = None, max_tool_tokens: int | None = None,
                 tool_timeout: float | None = None, tool_workers: int | None = None):
        from srtcli.rollout.agent.setup import ToolOptions

        self.tools = tools
        given = {"max_turns": max_turns, "max_tool_tokens": max_tool_tokens, "tool_timeout": tool_timeout,
                 "tool_workers": tool_workers}
        self.tool_options = ToolOptions(**{k: v for k, v in given.items() if v is not None})
        self._agents: dict[int, Any] = {}
        self.cache_location = cache
        self.budget, self.draft, self.slots, self.seed = budget, draft, slots, seed
        self.draft_mode, self.min_prob, self.draft_length, self.tail_nodes = draft_mode, min_prob, draft_length, tail_nodes
        self.tree_options, self.draft_stop = tree_options or {}, draft_stop
        self.session: Any = None
        self.drafter: Drafter | None = None
        self.calls = 0
        self.last: dict[str, float] = {}
        self._fingerprints: dict[int, str] = {}
        self._callback_added: set[int] = set()

    # -- the call TRL makes --------------------------------------------------------------
    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        from cache_store.uid import prompt_uid
        from srtcli.rollout.engine.sequence import Sequence

        self._hook_training_end(trainer)
        if trainer.tools or getattr(trainer, "environment_factories", None):
            raise ValueError("srt_rollout_func: the trainer's tools/environment_factory are not supported: "
                             "pass srt's tools= to srt_rollout_func instead")
        params, max_new = sampling_from(trainer)
        tok = trainer.processing_class
        agent = self._agent(tok)
        ids = tokenize_prompts(trainer, prompts, agent.schemas if agent is not None else None)
        fp = self._fingerprint(tok)
        seqs = [Sequence(p, max_new, group=prompt_uid(p, fp), meta={"index": i}) for i, p in enumerate(ids)]
        hooks = agent.hooks(tok, self.tool_options, {}, set(trainer.eos_token_ids)) if agent is not None else None
        rewards: dict[int, float | None] = {}
        try:
            engine = self._generate(trainer, seqs, params, max_new, agent, hooks, rewards)
        finally:
            if hooks is not None:
                hooks.close()
        if self.session is not None:
            self.session.end_batch()
        self._record(engine, self.drafter, trainer)
        out = {"prompt_ids": [list(s.prompt_ids) for s in seqs],
               "completion_ids": [list(s.output) for s in seqs],
               "logprobs": [list(s.logprobs[len(s.prompt_ids):]) for s in seqs]}
        if agent is not None:
            out["env_mask"] = [list(s.mask[len(s.prompt_ids):]) for s in seqs]
            if hooks.env_reward:
                out["env_reward"] = [rewards[i] for i in range(len(seqs))]
        return out

    def _generate(self, trainer: Any, seqs: list, params: Any, max_new: int, agent: Any, hooks: Any,
                  rewards: dict) -> Any:
        """Every sequence generated by an engine on the trainer's model (eval mode, no grad; its
        mode restored after), each group handed back to the drafter as it ends; the engine."""
        import torch

        from srtcli.rollout.embedded import make_engine
        from srtcli.rollout.groups import GroupCollector
        from srtcli.rollout.model_facts import context_length
        from srtcli.rollout.runahead import RunAhead, run_batches

        model, tok = unwrapped_model(trainer), trainer.processing_class
        drafter = self._drafter(params.temperature > 0)
        ctx = context_length(getattr(model.config, "max_position_embeddings", None), tok)
        room = agent.room(self.tool_options) if agent is not None else 0
        max_len = min(ctx, max(len(s.prompt_ids) for s in seqs) + max_new + room + 1)
        seed = (self.seed if self.seed is not None else trainer.args.seed) + self.calls
        self.calls += 1
        groups = GroupCollector(Counter(s.group for s in seqs))
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                engine = make_engine(model, params, drafter, hooks, slots=max(1, min(self.slots, len(seqs))),
                                     budget=self.budget if self.draft != "none" else 0, max_len=max_len,
                                     eos_ids=set(trainer.eos_token_ids), seed=seed, draft_length=self.draft_length,
                                     tail_nodes=self.tail_nodes)
                for seq in run_batches(engine, [admission(seqs)], [[]], RunAhead(enabled=False)):
                    if isinstance(seq, int):
                        continue
                    if hooks is not None:
                        rewards[seq.meta["index"]] = hooks.finish(seq)
                    if groups.add(seq) is not None:
                        drafter.group_done(seq.group)
        finally:
            model.train(was_training)
        return engine

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Store what the session still holds and close it (a later call opens it again); a
        session passed in as `cache` is its owner's to close."""
        self.drafter = None
        session, self.session = self.session, None
        if session is not None and session is not self.cache_location:
            session.close()

    def _drafter(self, sampling: bool) -> Drafter:
        from srtcli.rollout.drafters import make_drafter
        from srtcli.rollout.tree_session import TreeSession

        if isinstance(self.draft, Drafter):
            self.drafter = self.draft
        elif self.drafter is None:
            if self.draft == "srt":
                if isinstance(self.cache_location, TreeSession):
                    self.session = self.cache_location
                elif self.cache_location is not None:
                    self.session = TreeSession.open(self.cache_location, **self.tree_options)
                else:
                    self.session = TreeSession(**self.tree_options)
                self.drafter = make_drafter("srt", session=self.session, mode=self.draft_mode, min_prob=self.min_prob,
                                            seed=self.seed or 0, stop=self.draft_stop, record_probs=sampling)
            else:
                self.drafter = make_drafter(self.draft)
        return self.drafter

    def _agent(self, tok: Any) -> Any:
        """srt's tool setup for `tools` and this tokenizer (`agent_for`; None without tools)."""
        from srtcli.rollout.agent.setup import agent_for

        if self.tools is None:
            return None
        if id(tok) not in self._agents:
            self._agents[id(tok)] = agent_for(self.tools, tok)
        return self._agents[id(tok)]

    def _fingerprint(self, tok: Any) -> str:
        from srtcli.tokenizers import tokenizer_fingerprint

        key = id(tok)
        if key not in self._fingerprints:
            self._fingerprints[key] = tokenizer_fingerprint(tok)
        return self._fingerprints[key]

    def _hook_training_end(self, trainer: Any) -> None:
        """Close the cache when the trainer's training ends (once per trainer)."""
        if id(trainer) in self._callback_added:
            return
        from transformers import TrainerCallback

        owner = self

        class CloseAtTrainEnd(TrainerCallback):
            def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                owner.close()

        trainer.add_callback(CloseAtTrainEnd())
        self._callback_added.add(id(trainer))

    def _record(self, engine: Any, drafter: Drafter, trainer: Any) -> None:
        """The call's counts in `last`, and srt's three rates in the trainer's logged metrics."""
        st, ds = engine.stats, drafter.stats()
        self.last = {"forwards": st.forwards, "row_forwards": st.row_forwards, "emitted": st.emitted,
                     "drafted": st.drafted, "accepted": st.accepted,
                     "accepted_per_forward": st.emitted / st.row_forwards if st.row_forwards else 0.0,
                     "draft_acceptance_rate": st.accepted / st.drafted if st.drafted else 0.0,
                     "cache_hit_rate": ds.get("cache_hit_rate", 0.0)}
        metrics = getattr(trainer, "_metrics", None)
        if isinstance(metrics, dict):
            mode = "train" if trainer.model.training else "eval"
            for k in TRAINER_METRICS:
                metrics[mode][f"srt/{k}"].append(float(self.last[k]))


def unwrapped_model(trainer: Any) -> Any:
    """The trainer's model itself (accelerate's wrappers taken off), never a copy."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if getattr(model.config, "vision_config", None) is not None:
        raise ValueError("srt_rollout_func: vision-language models are not supported")
    if any(p.numel() == 0 for p in model.parameters()):
        raise ValueError("srt_rollout_func: the model's parameters are sharded (ZeRO-3/FSDP): not supported")
    return model


def sampling_from(trainer: Any) -> tuple[Any, int]:
    """srt's SamplingParams and the max completion length from the trainer's args; greedy when
    temperature is 0 or generation_kwargs turn sampling off."""
    from srtcli.rollout.engine.sampling import SamplingParams

    a = trainer.args
    extra = a.generation_kwargs or {}
    if a.min_p is not None or extra.get("min_p") is not None:
        raise ValueError("srt_rollout_func: min_p is not supported")
    if a.repetition_penalty != 1.0 or extra.get("repetition_penalty", 1.0) != 1.0:
        raise ValueError("srt_rollout_func: repetition_penalty other than 1.0 is not supported")
    temperature = extra.get("temperature", a.temperature)
    top_p, top_k = extra.get("top_p", a.top_p), extra.get("top_k", a.top_k)
    if extra.get("do_sample", True) is False:
        temperature = 0.0
    params = SamplingParams(float(temperature), float(top_p if top_p is not None else 1.0), int(top_k or 0))
    return params, int(extra.get("max_new_tokens", a.max_completion_length))


def tokenize_prompts(trainer: Any, prompts: list, tools: list[dict] | None = None) -> list[list[int]]:
    """Each prompt's token ids as TRL's own generation makes them (`GRPOTrainer._tokenize_prompts`):
    chat messages through the processing class's chat template with the generation prompt added,
    strings as they are. `tools` (JSON schemas) are shown to conversational prompts through the
    chat template. Each distinct prompt is tokenized once."""
    from trl.data_utils import is_conversational

    tok = trainer.processing_class
    keys = [repr(p) for p in prompts]
    order = list(dict.fromkeys(keys))
    first = {k: prompts[keys.index(k)] for k in order}
    unique = [first[k] for k in order]
    if is_conversational({"prompt": unique[0]}):
        out = tok.apply_chat_template(conversation=unique, tools=tools or None, chat_template=trainer.chat_template,
                                      add_generation_prompt=True, tokenize=True, return_dict=True,
                                      **(trainer.chat_template_kwargs or {}))["input_ids"]
    elif tools:
        raise ValueError("srt_rollout_func: tools with a chat template need conversational prompts (chat messages)")
    else:
        out = tok(text=unique)["input_ids"]
    by_key = {k: list(map(int, ids)) for k, ids in zip(order, out)}
    return [by_key[k] for k in keys]


def admission(seqs: list) -> list:
    """The engine's admission order, as `srt rollout`'s default (`plan.sample_major` over the
    groups in the order they first appear): the first sample of every prompt, then every
    second, ...: a prompt's later samples start once rows free up and draft from what its
    earlier ones generated."""
    from srtcli.rollout.plan import sample_major

    groups: dict[str, list] = {}
    for s in seqs:
        groups.setdefault(s.group, []).append(s)
    return sample_major(list(groups.values()))


RolloutFunc = Callable[[list, Any], dict]
