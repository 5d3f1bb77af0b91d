"""A byte-level tokenizer for the demo model, built locally (nothing is downloaded).

It has the shape of Qwen2's tokenizer — byte-level BPE, the special tokens `<|endoftext|>`,
`<|im_start|>`, `<|im_end|>` and a ChatML chat template — but no merges, so every byte is one
token. Character-level tokens make multi-digit arithmetic learnable by a model of a few hundred
thousand parameters, and the vocabulary stays at 259 entries.
"""

from __future__ import annotations

from pathlib import Path

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# ChatML, as Qwen2 uses it: the rollout engine renders prompts with this template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(out_dir: Path) -> None:
    """Build the byte-level tokenizer and save it in Hugging Face format under `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins for raw bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
    )
    fast.add_special_tokens({"additional_special_tokens": [IM_START], "pad_token": PAD_TOKEN, "eos_token": IM_END})
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
