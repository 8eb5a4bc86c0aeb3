"""`PackedGRPOTrainer` against TRL's own `GRPOTrainer` on the same batch: per-token log-probs and
entropies, every loss type with and without a KL term, gradients, a deliberately wrong tree mask,
and the tokens the packed forwards save. Tiny fp32 Llama on the CPU (sdpa tree backend)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer

import srtcli.trl.trainer as packed_mod
from attention.prefix_tree import PrefixTree
from srtcli.trl.trainer import PackedGRPOTrainer

K = 4
PROMPTS = ["12+3=", "7*8 is", "how much is 40-2?", "9"]  # different lengths: left padding
TOL = 1e-5


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from srtcli.tiny_model import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("trl_model"), kind="llama", sharp=1.0, seed=3)


def _trainer(cls, model_dir, out, beta=0.0, loss_type="dapo", temperature=0.8, gradient_checkpointing=False,
             **extra):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    torch.manual_seed(0)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=len(PROMPTS) * K, num_generations=K,
        max_completion_length=12, beta=beta, loss_type=loss_type, temperature=temperature,
        report_to="none", use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
        model_init_kwargs={"dtype": torch.float32}, seed=0, gradient_checkpointing=gradient_checkpointing, **extra)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    data = Dataset.from_dict({"prompt": PROMPTS * 4})
    return cls(model=str(model_dir), reward_funcs=_reward, args=args, train_dataset=data, processing_class=tok)


def _batch(trainer):
    """TRL's generation of one batch (every prompt K times, consecutive, as its sampler gives)."""
    torch.manual_seed(1)
    rows = [{"prompt": p} for p in PROMPTS for _ in range(K)]
    trainer.model.train()
    inputs = trainer._generate_and_score_completions(rows)
    # A random tiny model rarely samples its eos: end completions at varied lengths as an eos would
    # (right padding), give some siblings a common completion prefix, and mask one completion
    # entirely (as `mask_truncated_completions` does).
    ids, mask = inputs["completion_ids"].clone(), inputs["completion_mask"].clone()
    pad = trainer.processing_class.pad_token_id
    for i in range(ids.size(0)):
        if i % K == 1:
            ids[i, :3] = ids[i - 1, :3]
        n = 3 + (5 * i) % (ids.size(1) - 2)
        ids[i, n:], mask[i, n:] = pad, 0
    mask[-1] = 0
    inputs["completion_ids"], inputs["completion_mask"] = ids, mask
    return inputs


def _logps(trainer, inputs, model=None, entropy=True):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    lp, ent, _ = trainer._get_per_token_logps_and_entropies(
        model if model is not None else trainer.model, ids, att, inputs["completion_ids"].size(1),
        compute_entropy=entropy)
    return lp, ent


@pytest.fixture(scope="module")
def pair(model_dir, tmp_path_factory):
    """(TRL trainer, packed trainer, one batch), beta > 0 so both hold a reference model."""
    out = tmp_path_factory.mktemp("trl_out")
    plain = _trainer(GRPOTrainer, model_dir, out / "a", beta=0.05)
    packed = _trainer(PackedGRPOTrainer, model_dir, out / "b", beta=0.05)
    inputs = _batch(plain)
    packed.model.train()  # as TRL's train loop leaves both (dropout is off)
    return plain, packed, inputs


def test_batch_has_the_layout_packing_relies_on(pair):
    _, _, inputs = pair
    pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
    assert (pm == 0).any(), "prompts of different lengths: some left padding"
    assert (cm == 0).any() and (cm.sum(1) > 0).any(), "completions of different lengths"
    assert torch.equal(inputs["prompt_ids"][0], inputs["prompt_ids"][K - 1])


def test_logprobs_and_entropies_equal_trl(pair):
    plain, packed, inputs = pair
    with torch.no_grad():
        lp_a, ent_a = _logps(plain, inputs)
        lp_b, ent_b = _logps(packed, inputs)
    assert packed.srt_stats, "the packed path ran (no fallback)"
    assert lp_a.shape == lp_b.shape and lp_a.dtype == lp_b.dtype and ent_a.dtype == ent_b.dtype
    torch.testing.assert_close(lp_b, lp_a, atol=TOL, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=TOL, rtol=0)
    pad = inputs["completion_mask"] == 0
    assert (lp_b[pad] == 0).all() and (ent_b[pad] == 0).all()
    # chunked as TRL chunks (batch_size), and the reference model (no entropy) too
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        lp_c, ent_c, _ = packed._get_per_token_logps_and_entropies(
            packed.ref_model, ids, att, inputs["completion_ids"].size(1), batch_size=3)
        lp_d, _, _ = plain._get_per_token_logps_and_entropies(
            plain.ref_model, ids, att, inputs["completion_ids"].size(1), batch_size=3)
    assert ent_c is None
    torch.testing.assert_close(lp_c, lp_d, atol=TOL, rtol=0)


def test_packing_runs_fewer_tokens(pair):
    _, packed, inputs = pair
    with torch.no_grad():
        _logps(packed, inputs, entropy=False)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1).bool()
    seqs = [ids[i][att[i]] for i in range(ids.size(0))]
    expected = PrefixTree.build(seqs).packed_tokens()  # distinct prefixes of the batch
    assert packed.srt_stats["packed_tokens"] == expected
    assert packed.srt_stats["padded_tokens"] == ids.numel()
    # every prompt is encoded once instead of K times
    prompt_len = [int(m.sum()) for m in inputs["prompt_mask"][::K]]
    assert expected <= int(att.sum()) - (K - 1) * sum(prompt_len)
    assert expected / ids.numel() < 0.75


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"])
def test_loss_and_gradients_equal_trl(pair, loss_type):
    plain, packed, inputs = pair
    # luspo is meant with sequence-level importance sampling (GRPOConfig warns otherwise)
    level = "sequence" if loss_type == "luspo" else "token"
    inputs = dict(inputs)
    with torch.no_grad():  # a policy that moved since the rollout: ratios away from 1
        inputs["old_per_token_logps"] = _logps(plain, inputs, entropy=False)[0] + 0.05 * torch.randn(
            inputs["completion_ids"].shape, generator=torch.Generator().manual_seed(4))
    for beta in (0.0, 0.05):
        losses, grads = [], []
        for t in (plain, packed):
            t.loss_type, t.beta, t.current_gradient_accumulation_steps = loss_type, beta, 1
            t.importance_sampling_level = level
            t.model.zero_grad(set_to_none=True)
            own = dict(inputs)
            with torch.no_grad():  # each trainer's own reference log-probs
                own["ref_per_token_logps"] = _logps(t, inputs, model=t.ref_model, entropy=False)[0]
            t.srt_stats = {}
            loss = t._compute_loss(t.model, own)
            if t is packed:
                assert t.srt_stats, "the packed path ran"
            loss.backward()
            losses.append(loss.detach())
            grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
        torch.testing.assert_close(losses[1], losses[0], atol=TOL, rtol=0)
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for n in grads[0]:
            torch.testing.assert_close(grads[1][n], grads[0][n], atol=TOL, rtol=1e-4, msg=n)
    for t in (plain, packed):
        t.model.zero_grad(set_to_none=True)
        t.importance_sampling_level = "token"


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing(pair, reentrant):
    """Non-reentrant checkpointing recomputes inside the tree mask (packed, same gradients);
    reentrant checkpointing cannot, and falls back to TRL's forward."""
    plain, packed, inputs = pair
    grads = []
    for t in (plain, packed):
        t.loss_type, t.beta, t.current_gradient_accumulation_steps = "dapo", 0.0, 1
        t.model.gradient_checkpointing_enable({"use_reentrant": reentrant})
        t.model.train()  # layers checkpoint in training mode only
        try:
            t.model.zero_grad(set_to_none=True)
            t.srt_stats = {}
            t._compute_loss(t.model, inputs).backward()
            grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
        finally:
            t.model.gradient_checkpointing_disable()
            t.model.zero_grad(set_to_none=True)
        if t is packed:
            assert bool(t.srt_stats) is not reentrant
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=TOL, rtol=1e-4, msg=n)


@pytest.mark.parametrize("wrong", ["positions", "siblings"])
def test_wrong_tree_layout_breaks_logprobs(pair, monkeypatch, wrong):
    plain, packed, inputs = pair
    right = packed_mod.row_attention_inputs

    def broken(row):
        end, pos = right(row)
        if wrong == "positions":  # packed order instead of tree depth
            return end, torch.arange(pos.numel())
        return torch.full_like(end, end.numel() - 1), pos  # plain causal: a branch sees earlier siblings

    monkeypatch.setattr(packed_mod, "row_attention_inputs", broken)
    with torch.no_grad():
        lp_a, _ = _logps(plain, inputs, entropy=False)
        lp_b, _ = _logps(packed, inputs, entropy=False)
    assert (lp_b - lp_a).abs().max() > 1e-3


def test_fallback_for_unsupported_layout(pair):
    plain, packed, inputs = pair
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1).clone()
    att[0, -1], att[0, -2] = 1, 0  # a hole: not TRL's layout, so TRL's own path runs
    packed.srt_stats = {}
    with torch.no_grad():
        lp_b, _, _ = packed._get_per_token_logps_and_entropies(packed.model, ids, att, inputs["completion_ids"].size(1))
        lp_a, _, _ = plain._get_per_token_logps_and_entropies(plain.model, ids, att, inputs["completion_ids"].size(1))
    assert packed.srt_stats == {}
    torch.testing.assert_close(lp_b, lp_a, atol=0, rtol=0)


def _initial(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing,compiled", [(False, False), (True, False), (False, True)])
def test_train_step_with_accumulation_equal_trl(model_dir, tmp_path, checkpointing, compiled):
    """One optimizer step over 2 accumulated micro-batches (TRL's own train loop, its own
    generation): the same updated weights, with and without gradient checkpointing (GRPOConfig's
    default; the backward recomputes each layer inside the tree mask), and with `torch_compile`
    (TRL's compiled model against the packed forwards of its uncompiled module)."""
    weights = []
    for cls, name in ((GRPOTrainer, "a"), (PackedGRPOTrainer, "b")):
        t = _trainer(cls, model_dir, tmp_path / name, beta=0.05, loss_type="dapo",
                     gradient_accumulation_steps=2, max_steps=1, learning_rate=1.0, optim="sgd",
                     gradient_checkpointing=checkpointing, torch_compile=compiled)
        torch.manual_seed(5)
        t.train()
        if cls is PackedGRPOTrainer:  # the last forward, the policy's under autograd, was packed
            assert t.srt_stats["grad"] and t.srt_stats["packed_tokens"] < t.srt_stats["padded_tokens"]
        assert compiled == (t.model_wrapped is not t.model)  # TRL trained a torch.compile wrapper
        weights.append({n: p.detach().clone() for n, p in t.model.named_parameters()})
    # plain SGD with lr 1: the update is the gradient itself (Adam's first step, g / |g|, would
    # turn rounding noise on near-zero gradients into full-size steps)
    moved = max((weights[0][n] - w).abs().max().item() for n, w in _initial(model_dir).items())
    assert moved > 1e-3
    for n in weights[0]:
        torch.testing.assert_close(weights[1][n], weights[0][n], atol=1e-5, rtol=1e-4, msg=n)
