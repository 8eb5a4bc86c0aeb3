"""Train the agent example's model from scratch: the arith workload with chat-template tool calls.

    python examples/agent/train_model.py                  # writes examples/agent/model/
    python examples/agent/train_model.py --steps 50 --out /tmp/m

The same recipe as the bundled model (examples/arith/train_model.py: its byte-level BPE with
single-digit tokens, its Llama, its supervised loop), with the Hermes tool format of
`srtcli.tiny_model.TOOL_CHAT_TEMPLATE` (agent_data.py renders the examples). Seeded end to end,
so the same flags on the same machine give the same weights. Before training it checks on seeded
examples that the tokenization is rollout's, segment by segment (`agent_data.check`).

Every example begins with the same system turn (the tool schema, ~110 of its ~200 tokens), so
`SharedPrefixLM` runs that prefix once per batch and the rows from there on: the same loss and
gradients as the full rows (checked before training) at about half the cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import shutil
import time
from pathlib import Path

import torch

import agent_data
from srtcli.models import cache_keyword, returned_cache
from srtcli.tiny_model import SPECIAL, TOOL_CHAT_TEMPLATE, TOOL_TAGS

HERE = Path(__file__).resolve().parent
TAGS = TOOL_TAGS + ["<answer>", "</answer>"]


def _arith_train_model():
    # Loaded by path: it is also named train_model.py, and this script's directory comes first.
    spec = importlib.util.spec_from_file_location("arith_train_model", agent_data.ARITH / "train_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


arith_train = _arith_train_model()


def tokenizer_corpus(tok, rng: random.Random, n: int) -> list[str]:
    """`n` rendered conversations with the chat markers and tags cut out (they are whole tokens,
    added after the BPE is trained, so merges need not learn them)."""
    texts = []
    for _, (prompt, sol) in zip(range(n), agent_data.training_examples(rng, set())):
        text = tok.apply_chat_template(agent_data.conversation(prompt, sol), tools=agent_data.TOOLS, tokenize=False)
        for marker in SPECIAL + TAGS:
            text = text.replace(marker, "")
        texts.append(text)
    return texts


def build_tokenizer(rng: random.Random, work: Path, args: argparse.Namespace):
    """Train the tokenizer on rendered conversations and save it into `work`."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    # Rendering needs only the template: a throwaway tokenizer carries it.
    renderer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    renderer.chat_template = TOOL_CHAT_TEMPLATE
    corpus = tokenizer_corpus(renderer, rng, 3000)
    return arith_train.save_tokenizer(arith_train.build_tokenizer(corpus, args.vocab_size, TAGS), work,
                                      args.max_len, TOOL_CHAT_TEMPLATE)


class SharedPrefixLM(torch.nn.Module):
    """`lm` over rows that all begin with `prefix`: forward takes the rows without it (right-padded)
    and gives the loss of the full rows, the prefix's keys and values computed once per batch."""

    def __init__(self, lm: torch.nn.Module, prefix: list[int]) -> None:
        super().__init__()
        self.lm = lm
        self.register_buffer("prefix", torch.tensor([prefix]), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor):
        rows, width = input_ids.shape[0], self.prefix.shape[1]
        cache = returned_cache(self.lm.model(input_ids=self.prefix, use_cache=True))
        cache.batch_repeat_interleave(rows)  # differentiable: gradients reach the prefix's keys and values
        mask = torch.cat([attention_mask.new_ones(rows, width), attention_mask], dim=1)
        return self.lm(input_ids=input_ids, attention_mask=mask, labels=labels, **{cache_keyword(self.lm): cache})


def shared_prefix(tok) -> list[int]:
    """The ids every example starts with: the system turn, up to the user turn's `<|im_start|>`."""
    ids = tok.encode(agent_data.prompt_text(tok, ""), add_special_tokens=False)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    return ids[: [i for i, t in enumerate(ids) if t == start][1]]


def suffix_rows(tok, prefix: list[int], examples, size: int) -> list[tuple[list[int], list[int]]]:
    """`size` encoded examples with the shared prefix cut off (checked to be there)."""
    rows = []
    for _, (prompt, sol) in zip(range(size), examples):
        ids, mask = agent_data.encode_example(tok, prompt, sol)
        assert ids[: len(prefix)] == prefix and not any(mask[: len(prefix)]), prompt
        rows.append((ids[len(prefix):], mask[len(prefix):]))
    return rows


def length_grouped_batches(rows_of, rng: random.Random, size: int, group: int = 8):
    """Endless batches of `size` rows of similar length: `group` batches' worth drawn at a time,
    sorted by length, cut into batches, shuffled (less padding: a third of the tokens otherwise)."""
    while True:
        pool = sorted(rows_of(size * group), key=lambda row: len(row[0]))
        batches = [pool[i:i + size] for i in range(0, len(pool), size)]
        rng.shuffle(batches)
        yield from batches


def check_shared_prefix(model: torch.nn.Module, tok, prefix: list[int], seed: int) -> float:
    """The largest difference, loss and gradients, between full rows and SharedPrefixLM on one batch."""
    full = [agent_data.encode_example(tok, p, s) for _, (p, s) in zip(range(8), agent_data.training_examples(random.Random(seed), set()))]
    cut = [(ids[len(prefix):], mask[len(prefix):]) for ids, mask in full]
    grads = []
    for forward, rows in ((model, full), (SharedPrefixLM(model, prefix), cut)):
        ids, labels, attn = arith_train.collate(rows, tok.pad_token_id)
        model.zero_grad()
        loss = forward(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        grads.append([loss.detach().reshape(1)] + [q.grad.flatten() for q in model.parameters()])
    model.zero_grad()
    return max((a - b).abs().max().item() for a, b in zip(*grads))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # the arith trainer's flags; 512 positions: the system turn alone is ~110 tokens
    return arith_train.parse_args(argv, out=HERE / "model", max_len=512, description=__doc__)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    work = args.out.with_name(args.out.name + ".tmp")  # swapped in at the end (see arith's publish)
    shutil.rmtree(work, ignore_errors=True)
    tok = build_tokenizer(rng, work, args)
    print("self-check:", json.dumps(agent_data.check(tok)), flush=True)
    model = arith_train.build_model(len(tok), args, tok)
    prefix = shared_prefix(tok)
    diff = check_shared_prefix(model, tok, prefix, args.seed)
    print(f"shared prefix: {len(prefix)} tokens, full rows vs shared prefix: max difference {diff:.1e}", flush=True)
    assert diff < 1e-5, diff
    avoid = {r["prompt"] for r in agent_data.workload_prompts()}
    examples = agent_data.training_examples(rng, avoid)
    batches = length_grouped_batches(lambda n: suffix_rows(tok, prefix, examples, n), rng, args.batch_size)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(tok)}, {n_params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch_size}", flush=True)
    start = time.time()
    arith_train.fit(SharedPrefixLM(model, prefix), lambda: arith_train.collate(next(batches), tok.pad_token_id), args)
    arith_train.publish(model, tok, work, args.out)
    print(f"saved to {args.out} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
