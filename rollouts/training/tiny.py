"""A tiny randomly initialised chat model with a character-level vocabulary, built in memory.

For tests and examples that need a real torch causal LM and a real tokenizer with a chat
template without downloading anything: `model, tokenizer = tiny_chat_model(seed=0)`.
"""

from __future__ import annotations

import string
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHARACTERS = string.ascii_lowercase + string.digits + " \n{}\":,.+-*/=?_[]()'!<>|"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer() -> Any:
    """A fast tokenizer: one token per character (lower-case letters, digits, punctuation), the
    ChatML special tokens, `<|im_end|>` as end of sequence; text is lower-cased."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab["<unk>"] = len(vocab)
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_chat_model(seed: int = 0, *, hidden_size: int = 32, layers: int = 2) -> tuple[Any, Any]:
    """`(model, tokenizer)`: a randomly initialised Llama-architecture model (float32, eval mode)
    over `tiny_tokenizer()`'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.eval()
    return model, tokenizer
