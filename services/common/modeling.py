"""Model loading and the per-token log-probability / entropy computation shared by rollout and learner.

Both sides compute log pi(token) from logits divided by the sampling temperature tau, so the
learner's ratio pi_theta / pi_old starts at exactly the sampler's value. `token_logprobs` works
in chunks over the sequence: the vocabulary projection and softmax for one chunk of positions at
a time (recomputed in the backward pass), so memory holds chunk x vocab floats, not tokens x vocab.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A causal LM from a Hugging Face directory, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def eos_token_ids(model, tokenizer) -> set[int]:
    """Token ids that end a response: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return ids


def export_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights for publishing: tied output embeddings are stored once (as HF does)."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def load_state_dict(model, state: dict[str, torch.Tensor]) -> None:
    """Load published weights into `model`; raise if they do not fit it exactly."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if getattr(model.config, "tie_word_embeddings", False):
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def _logp_entropy_chunk(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    """log pi(target) and the full-vocabulary entropy for one chunk of positions.

    hidden: (B, C, H); weight: (V, H); targets: (B, C) -> two (B, C) float32 tensors.
    """
    logits = F.linear(hidden, weight).float() / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    probs = torch.softmax(logits, dim=-1)
    entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    chunk_size: int = 1024,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position log-probabilities of the next token, and the policy's entropy there.

    input_ids, attention_mask: (B, L), right-padded. Returns logp (B, L-1) where
    logp[:, t] = log pi(input_ids[:, t+1] | input_ids[:, :t+1]) at temperature `temperature`, and
    the entropy (B, L-1) of that next-token distribution (None if `with_entropy` is False).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state[:, :-1]
    targets = input_ids[:, 1:]
    weight = model.lm_head.weight
    logps, ents = [], []
    for start in range(0, hidden.shape[1], chunk_size):
        h = hidden[:, start : start + chunk_size]
        t = targets[:, start : start + chunk_size]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_logp_entropy_chunk, h, weight, t, temperature, use_reentrant=False)
        else:
            lp, ent = _logp_entropy_chunk(h, weight, t, temperature)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps, dim=1)
    entropy = torch.cat(ents, dim=1) if with_entropy else None
    return logp, entropy
