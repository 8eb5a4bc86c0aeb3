"""Train srt's bundled model from scratch: a tokenizer and a small Llama on the arith workload.

    python examples/arith/train_model.py                       # writes srtcli/bundled_model/
    python examples/arith/train_model.py --steps 50 --out /tmp/m

Seeded end to end (data, tokenizer, init, batches), so the same flags on the same machine give
the same weights. Pieces:

1. `build_tokenizer` trains a small byte-level BPE on a corpus of problems and solutions; digits
   are always single tokens, the tool tags and the chat markers are whole added tokens, and any
   text at all is encodable (no unknown token).
2. `encode_example` renders the chat template around one problem and one sampled solution and
   marks what is trained: the assistant's own tokens and the closing eos, never the prompt and
   never the `<result>...</result>` a tool writes (rollout appends those; the model does not
   produce them).
3. A plain supervised loop (AdamW, warmup + cosine) over freshly generated problems that avoid
   the prompts of prompts.jsonl and eval.jsonl, so RL on those prompts has something to learn.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arith_data  # noqa: E402  (this directory; examples/ is not a package)

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent.parent / "srtcli" / "bundled_model"
SPECIAL = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<calc>", "</calc>", "<result>", "</result>", "<answer>", "</answer>"]
EOS, PAD = "<|im_end|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_RESULT = re.compile(r"(<result>.*?</result>)")


def build_tokenizer(texts: list[str], vocab_size: int, tags: list[str] = TAGS) -> Tokenizer:
    """A byte-level BPE whose digits are single tokens and whose `tags` are whole tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Added after training so BPE never merges across them; not "special", so decoding with
    # skip_special_tokens=True keeps them (rewards and tools read them from decoded text).
    tok.add_tokens([AddedToken(t, single_word=False, normalized=False) for t in tags])
    return tok


def save_tokenizer(tok: Tokenizer, out: Path, max_len: int, chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), **{k: v for k, v in config.items() if k != "tokenizer_class"})


def encode_example(hf_tok: PreTrainedTokenizerFast, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) for one chat: mask 1 on the assistant's own tokens and the eos."""
    head = hf_tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = hf_tok.encode(head, add_special_tokens=False)
    mask = [0] * len(ids)
    for piece in _RESULT.split(response):
        if not piece:
            continue
        piece_ids = hf_tok.encode(piece, add_special_tokens=False)
        ids += piece_ids
        mask += [0 if _RESULT.fullmatch(piece) else 1] * len(piece_ids)
    ids.append(hf_tok.convert_tokens_to_ids(EOS))
    mask.append(1)
    return ids, mask


def make_batch(hf_tok, rng: random.Random, size: int, avoid: set[str], pad_id: int):
    rows = []
    while len(rows) < size:
        p = arith_data.make_problem(rng)
        if p.prompt not in avoid:
            rows.append(encode_example(hf_tok, p.prompt, arith_data.solution_text(p, rng)))
    return collate(rows, pad_id)


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int):
    """(input_ids, labels, attention_mask) for (ids, loss_mask) rows, right-padded."""
    size, width = len(rows), max(len(ids) for ids, _ in rows)
    ids = torch.full((size, width), pad_id)
    labels = torch.full((size, width), -100)
    for i, (row, mask) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor([t if m else -100 for t, m in zip(row, mask)])
    return ids, labels, (ids != pad_id).long()


def build_model(vocab: int, args: argparse.Namespace, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads // 2,
        max_position_embeddings=args.max_len, tie_word_embeddings=True, rope_theta=10000.0,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def parse_args(argv: list[str] | None = None, out: Path = DEFAULT_OUT, max_len: int = 256,
               description: str = __doc__) -> argparse.Namespace:
    """The trainer's flags; another workload's trainer passes its own output, context and doc."""
    ap = argparse.ArgumentParser(description=description.split("\n")[0])
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=160)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=640)
    ap.add_argument("--max-len", type=int, default=max_len, help="positions")
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest on a busy machine")
    ap.add_argument("--log-every", type=int, default=50)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    corpus = [CHAT_TEMPLATE.replace("{", " ").replace("}", " "), "system user assistant tool"] * 50
    for _ in range(3000):
        p = arith_data.make_problem(rng)
        corpus += [p.prompt, arith_data.solution_text(p, rng)]
    # Build in a side directory and swap it in at the end, so that a reader of the bundled
    # model never sees a half-written one (others load it while a new version trains).
    work = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    tok = save_tokenizer(build_tokenizer(corpus, args.vocab_size), work, args.max_len)
    model = build_model(len(tok), args, tok)
    avoid = {json.loads(line)["prompt"] for f in ("prompts.jsonl", "eval.jsonl") if (HERE / f).exists()
             for line in (HERE / f).read_text().splitlines() if line.strip()}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocab {len(tok)}, {n_params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch_size}", flush=True)
    start = time.time()
    fit(model, lambda: make_batch(tok, rng, args.batch_size, avoid, tok.pad_token_id), args)
    publish(model, tok, work, args.out)
    print(f"saved to {args.out} in {time.time() - start:.0f}s")


def fit(model: LlamaForCausalLM, next_batch, args: argparse.Namespace) -> None:
    """The supervised loop: `args.steps` AdamW steps (warmup + cosine) on `next_batch()` batches."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup)
                                              * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    model.train()
    start, running = time.time(), None
    for step in range(args.steps):
        ids, labels, attn = next_batch()
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            print(f"step {step + 1}: loss {running:.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()


def publish(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, work: Path, out: Path) -> None:
    """Save the model and its generation config into `work` (the tokenizer is there already),
    then swap `work` in as `out`."""
    model.save_pretrained(work)
    GenerationConfig(do_sample=True, temperature=1.0, max_new_tokens=96,  # plain sampling: no top-k/top-p
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(work)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    work.rename(out)
    shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    main()
