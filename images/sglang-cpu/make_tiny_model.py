"""Write a tiny random Qwen2 model and its tokenizer into a directory (no model hub).

The real SGLang server runs on CPU on the local cluster and in the real-SGLang test tier
with this model: random weights (fixed seed), a byte-level BPE tokenizer trained here
on a fixed corpus, and a chat template, so ``/generate`` and the OpenAI routes both
work. Same seed, same files: two machines generate the same model.

    python images/sglang-cpu/make_tiny_model.py DIR     # prints DIR when done

Written once per directory: a ``.complete`` marker holding the recipe's hash makes a
second call a no-op (and a changed recipe regenerates).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 20261201
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
VOCAB = 1024
MAX_POSITIONS = 2048
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
RECIPE = json.dumps(
    [SEED, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, MAX_POSITIONS, CHAT_TEMPLATE, SPECIAL, 1]
)
MARKER = ".complete"


def corpus() -> list[str]:
    """A fixed training text for the tokenizer (no download)."""
    words = [
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "is",
        "on",
        "for",
        "with",
        "drill",
        "decode",
        "prefill",
        "group",
        "rank",
        "tensor",
        "parallel",
        "lockstep",
        "request",
        "token",
        "model",
        "server",
        "probe",
        "restart",
        "epoch",
        "desync",
        "hang",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "hello",
        "world",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
    ]
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * k) % len(words)] for k in range(1, 12)) + f" {i}")
    return lines


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 64,  # room below the model's vocab for the special tokens
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token=None,
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def write_model(out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=vocab["<|im_end|>"],
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def make(directory: Path) -> Path:
    """Generate the model into ``directory`` unless it already holds this recipe's."""
    want = hashlib.sha256(RECIPE.encode()).hexdigest()
    marker = directory / MARKER
    if marker.exists() and marker.read_text().strip() == want:
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=directory.parent))
    try:
        write_tokenizer(tmp)
        write_model(tmp)
        (tmp / MARKER).write_text(want + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py DIR")
    print(make(Path(sys.argv[1])))
