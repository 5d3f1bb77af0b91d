"""Prompts as token ids: the tokenizer and the one renderer of chat messages (torch-free, so the
controller counts prompt tokens exactly as the rollout engines do without installing torch)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer  # heavy: imported by the processes that load a model, when they do

    return AutoTokenizer.from_pretrained(str(path))


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """A prompt's token ids: the chat `messages` rendered with the tokenizer's chat template and
    the generation prompt (the assistant turn's opening). The one renderer of the platform: the
    rollout engines, the controller's length checks and the demo's warm start all use it, so
    they count the same tokens. A tokenizer without a chat template is refused (ValueError)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; MAGIC renders prompts as chat messages (use an instruct/chat model, or add a template)")
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)
