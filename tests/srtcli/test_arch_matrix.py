"""Exact on every architecture family srt accepts, sliding windows and softcapping included.

One tiny random model per family (tests/srtcli/rollout/engine/support.py ARCHS: Llama, Qwen2 with
grouped KV heads, Mistral, GPT-2, Phi, Phi-3, Gemma, OPT, Qwen3, GPT-NeoX; Mistral with a
16-position window on 60-token sequences, Qwen2 and Qwen3 with a window on one layer, Gemma2
with alternating windows and attention and final-logit softcaps, Gemma3), with the bundled
tokenizer, checked against transformers' own computations (the rollout checks and the packed
log-probs run on `SRT_TEST_DEVICE`, and `srt train` takes the GPU by itself where there is one,
so bench/gpu_check.sh runs them on CUDA too, FlexAttention compiled):

- greedy `srt rollout` (`--draft none` and `--draft srt`) equals HF `generate(do_sample=False)`;
- the old log-probs a sampled rollout writes equal HF's forward within 1e-4;
- `srt pack`'s prefix-tree rows give the same per-sequence log-probs as HF's forward (every
  backend), and one `srt train` step over the shards equals the step over the steps pool, with
  ratios of exactly 1 (the pool's old log-probs are the policy's own);
- an engine or tree attention that drops the window or the softcap fails these checks;
- what srt does not implement (attention sinks, attention computed inside the model, a
  bidirectional mask) is refused with one line before anything is written.

The reference for softcapping models is transformers' eager attention: its sdpa attention
silently ignores `softcap`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AttentionInterface, AutoModelForCausalLM

from srtcli.cli import cli
from srtcli.pool import read_pool
from tests.srtcli.rollout.engine.support import ARCHS, DEVICE, SOFTCAPPED, WINDOWED, make_arch_model_dir

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
TOL = 1e-4
MAX_NEW = 40
PROMPTS = ["Tom has 3 pens and 4 cups.", "What is 7*6?"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("archs")
    lines = [json.dumps({"id": f"q{i}", "prompt": p}) for i, p in enumerate(PROMPTS)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return root


def model_dir(root: Path, name: str) -> Path:
    path = root / name
    if not (path / "config.json").exists():
        make_arch_model_dir(path, name)
    return path


def hf_model(path: Path, name: str):
    """transformers' own model: eager attention where it softcaps (its sdpa drops the softcap)."""
    attn = "eager" if name in SOFTCAPPED else "sdpa"
    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation=attn).float().eval()


def srt(*args) -> dict:
    r = CliRunner().invoke(cli, [str(a) for a in args] + ["--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def rollout(root: Path, name: str, tag: str, *flags) -> list:
    out = root / f"pool-{name}-{tag}"
    if not out.exists():
        srt("rollout", "--prompts", root / "prompts.jsonl", "--model", model_dir(root, name), "-n", 2,
            "--max-new-tokens", MAX_NEW, "--device", DEVICE, "--out", out, "--cache", root / f"cache-{name}-{tag}", *flags)
    return read_pool(out)


def sampled_pool(root: Path, name: str) -> list:
    return rollout(root, name, "sampled", "--temperature", 1, "--draft", "srt", "--seed", 3)


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0].float().cpu()
    return logits.log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def hf_generate(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=model.device), do_sample=False, max_new_tokens=MAX_NEW,
                             eos_token_id=2, pad_token_id=0)
    return out[0].tolist()


def prompt_of(step) -> list[int]:
    return step.input_ids[: len(step.input_ids) - sum(step.loss_mask)]


def assert_greedy_is_hf(root: Path, name: str, draft: str, tag: str) -> None:
    steps = rollout(root, name, tag, "--temperature", 0, "--draft", draft)
    assert len(steps) == 2 * len(PROMPTS)
    ref = hf_model(model_dir(root, name), name).to(DEVICE)
    for st in steps:
        assert st.input_ids == hf_generate(ref, prompt_of(st)), (name, draft, st.meta)


@pytest.mark.parametrize("draft", ["none", "srt"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_greedy_rollout_is_hf_generate(root, name, draft):
    assert_greedy_is_hf(root, name, draft, f"greedy-{draft}")


@pytest.mark.parametrize("name", list(ARCHS))
def test_old_logprobs_are_hf_forward(root, name):
    steps = sampled_pool(root, name)
    ref = hf_model(model_dir(root, name), name).to(DEVICE)
    long = max(len(st.input_ids) for st in steps)
    assert long > 40  # well past every window
    for st in steps:
        mask = torch.tensor(st.loss_mask[1:], dtype=torch.bool)
        got = torch.tensor(st.old_logprobs[1:])
        assert (got - hf_logprobs(ref, st.input_ids))[mask].abs().max().item() <= TOL, name


def shards_of(root: Path, name: str) -> Path:
    sampled_pool(root, name)
    out = root / f"shards-{name}"
    if not out.exists():
        srt("pack", "--steps", root / f"pool-{name}-sampled", "--out", out)
    return out


def packed_logprob_error(root: Path, name: str, backend: str) -> float:
    from srtcli.train.data import load_packed
    from srtcli.train.logprobs import packed_logprobs

    ref = hf_model(model_dir(root, name), name).to(DEVICE)
    worst = 0.0
    for row in load_packed(shards_of(root, name)).rows:
        with torch.no_grad():
            lps = packed_logprobs(ref, row.packed, backend)
        for seq, lp in zip(row.seqs, lps):
            worst = max(worst, (lp.cpu() - hf_logprobs(ref, seq.input_ids)).abs().max().item())
    return worst


@pytest.mark.parametrize("name", list(ARCHS))
def test_packed_logprobs_are_hf_forward(root, name):
    backends = ("sdpa", "eager", "flex") if name in WINDOWED + SOFTCAPPED else ("sdpa",)
    for backend in backends:
        assert packed_logprob_error(root, name, backend) <= TOL, (name, backend)


@pytest.mark.parametrize("name", sorted(set(WINDOWED + SOFTCAPPED)))
def test_a_train_step_over_shards_is_the_step_over_steps(root, name):
    common = ["--model", model_dir(root, name), "--lr", "1e-3"]
    a = srt("train", "--shards", shards_of(root, name), "--out", root / f"train-{name}-shards", *common)
    b = srt("train", "--steps", root / f"pool-{name}-sampled", "--out", root / f"train-{name}-steps", *common)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for run in ("shards", "steps"):
        rec = json.loads((root / f"train-{name}-{run}" / "metrics.jsonl").read_text().splitlines()[0])
        # the rollout's old log-probs are the policy's own: nothing clips, every ratio is 1
        assert rec["clip_frac"] == 0 and rec["ratio_mean"] == pytest.approx(1.0, abs=TOL), (name, run)


def _dropping(fn):
    """A WRONG attention on purpose: `fn` without the layer's window and softcap."""
    def wrong(*args, sliding_window=None, softcap=None, **kwargs):
        return fn(*args, **kwargs)
    return wrong


@pytest.mark.parametrize("name", ["mistral_sw", "qwen3_sw", "gemma2"])
def test_an_engine_dropping_the_window_or_softcap_fails(root, name, monkeypatch):
    slots = AttentionInterface._global_mapping["srt_slots"]
    monkeypatch.setitem(AttentionInterface._global_mapping, "srt_slots", _dropping(slots))
    with pytest.raises(AssertionError):
        assert_greedy_is_hf(root, name, "none", "wrong-engine")


@pytest.mark.parametrize("name", ["mistral_sw", "qwen3_sw", "gemma2"])
def test_a_tree_attention_dropping_the_window_or_softcap_fails(root, name, monkeypatch):
    import attention.hf as hf

    forward = hf._tree_forward
    monkeypatch.setattr(hf, "_tree_forward", lambda *a: forward(*a[:7], None, None))  # no window, no softcap
    assert packed_logprob_error(root, name, "sdpa") > 1e-2


UNSUPPORTED = {
    # attention sinks: the layer passes `s_aux`
    "sinks": ("gpt_oss", dict(intermediate_size=64, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
                              layer_types=["sliding_attention", "full_attention"], sliding_window=8)),
    # ALiBi inside the model's own attention: no call through transformers' attention interface
    "alibi": ("mpt", dict(d_model=64, n_heads=4, n_layers=2)),
    # a bidirectional mask where srt's attention is causal
    "bidirectional": ("gemma3_text", dict(intermediate_size=128, head_dim=16, use_bidirectional_attention=True)),
}
WHY = {"sinks": "`s_aux`", "alibi": "attention interface", "bidirectional": "not causal"}


def unsupported_model(kind: str):
    from transformers import AutoConfig

    model_type, kw = UNSUPPORTED[kind]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, vocab_size=646, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, pad_token_id=0, **kw)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("kind", list(UNSUPPORTED))
def test_what_srt_does_not_implement_is_found_from_the_model(kind):
    from srtcli.attention_support import check_attention
    from srtcli.errors import SrtError

    with pytest.raises(SrtError, match=WHY[kind]) as e:
        check_attention(unsupported_model(kind), "m")
    assert str(e.value).startswith("m: srt cannot run this model exactly") and "\n" not in str(e.value)


def one_line_refusal(*args) -> str:
    r = CliRunner().invoke(cli, [str(a) for a in args])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def test_rollout_and_train_refuse_attention_sinks_before_writing(root):
    import shutil

    from srtcli.models import default_model_dir

    sinks = root / "sinks"
    unsupported_model("sinks").save_pretrained(sinks)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / f, sinks / f)
    out = one_line_refusal("rollout", "--prompts", root / "prompts.jsonl", "--model", sinks, "--out", root / "p-sinks",
                           "--cache", root / "c-sinks")
    assert "s_aux" in out and not (root / "p-sinks").exists() and not (root / "c-sinks").exists()
    # eager: transformers has no sdpa attention for this model (an sdpa load is refused anyway)
    out = one_line_refusal("train", "--shards", shards_of(root, "llama"), "--model", sinks, "--attn", "eager",
                           "--out", root / "t-sinks")
    assert "s_aux" in out and not (root / "t-sinks").exists()


def test_post_processed_logits_are_found_from_the_model():
    from transformers import GraniteConfig

    from attention import tree_logprobs
    from attention.logprobs import POST_HEAD
    from srtcli.attention_support import check_attention

    torch.manual_seed(0)
    cfg = GraniteConfig(vocab_size=646, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0, initializer_range=0.3)
    model = AutoModelForCausalLM.from_config(cfg).eval()  # logits = head(h) / logits_scaling
    check_attention(model, "granite")
    seqs = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 12]]
    want = [hf_logprobs(model, s) for s in seqs]
    with torch.no_grad():
        err = max((g - w).abs().max().item() for g, w in zip(tree_logprobs(model, seqs), want))
        setattr(model, POST_HEAD, False)  # what a check by config names alone concludes
        wrong = max((g - w).abs().max().item() for g, w in zip(tree_logprobs(model, seqs), want))
    assert err <= TOL < 1e-2 < wrong


@pytest.mark.parametrize("name", ["mistral_sw", "gemma2"])
def test_tree_drafts_see_the_window_by_depth(name):
    """Tree nodes sit at the positions of their depths, not of their cache columns: a window of
    2 positions hides a node's grandparent and all but the last pending token."""
    from srtcli.rollout.engine.engine import Engine
    from srtcli.rollout.engine.sequence import Sequence
    from srtcli.rollout.engine.sampling import SamplingParams
    from tests.srtcli.rollout.engine.test_engine import PROMPTS, drive
    from tests.srtcli.rollout.engine.support import arch_model, plain_greedy
    from tests.srtcli.rollout.engine.test_tree_verify import OracleTree

    model = arch_model(name, sliding_window=2, attn_implementation="eager")
    new = [8 + 3 * i for i in range(len(PROMPTS))]
    refs = {tuple(p): plain_greedy(model, p, max(new)) for p in PROMPTS}
    eng = Engine(model, SamplingParams(temperature=0), OracleTree(refs), slots=3, budget=6, max_len=128,
                 draft_length="fixed")
    seqs = [Sequence(p, max_new_tokens=n) for p, n in zip(PROMPTS, new)]
    drive(eng, seqs)
    assert all(s.output == refs[tuple(s.prompt_ids)][: s.max_new_tokens] for s in seqs)
    assert eng.accepted_per_forward > 2.5  # the later branches really were accepted


def test_a_model_with_fewer_positions_than_the_probe_is_checked_not_refused():
    from transformers import GPT2Config

    from srtcli.attention_support import PROBE_LEN, check_attention

    cfg = GPT2Config(vocab_size=646, n_embd=32, n_layer=2, n_head=2, n_positions=PROBE_LEN - 4)
    check_attention(AutoModelForCausalLM.from_config(cfg).eval(), "short")  # probes with 8 tokens
