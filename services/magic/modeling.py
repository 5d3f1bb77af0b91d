"""Model loading and the per-token log-probability / entropy computation shared by rollout and learner.

Both sides compute log pi(token) from logits divided by the sampling temperature tau, so the
learner's ratio pi_theta / pi_old starts at exactly the sampler's value. `token_logprobs` works
in chunks over the sequence: the vocabulary projection and softmax for one chunk of positions at
a time, recomputed in the backward pass with analytic gradients (`ChunkedLogpEntropy`), so
memory holds chunk x vocab floats, not tokens x vocab.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A causal LM from a Hugging Face directory, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def load_model_config(path: str | Path):
    """The Hugging Face config of a model directory (no weights loaded)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


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


def cast_state_dict(state: dict[str, torch.Tensor] | None, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """Floating-point tensors of `state` in `dtype` (what a rollout engine of that dtype loads);
    integer tensors unchanged. None (ranks > 0) stays None."""
    if state is None:
        return None
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def load_state_dict(model, state: dict[str, torch.Tensor]) -> None:
    """Load published weights into `model`; raise if they do not fit it exactly."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if getattr(model.config, "tie_word_embeddings", False):
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


class ChunkedLogpEntropy(torch.autograd.Function):
    """log pi(target) and the full-vocabulary entropy from hidden states and the output projection,
    computed over chunks of positions so that at most `chunk_size` x vocab float32 logits exist at
    once — in the forward pass and in the backward pass, which recomputes each chunk's logits and
    applies the analytic gradients (z = logits / tau, p = softmax(z), H = -sum p log p):

        d logp_t / d z_j = 1{j = t} - p_j,        d H / d z_j = -p_j (log p_j + H).

    hidden: (N, H); weight: (V, H); targets: (N,) -> logp (N,), entropy (N,), in float32 (float64
    for a float64 model).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk_size: int):
        n = hidden.shape[0]
        acc = torch.promote_types(weight.dtype, torch.float32)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty_like(logp)
        logz = torch.empty_like(logp)
        for s in range(0, n, chunk_size):
            z = F.linear(hidden[s : s + chunk_size], weight).to(acc).div_(temperature)
            lz = torch.logsumexp(z, dim=-1)
            logz[s : s + chunk_size] = lz
            logp[s : s + chunk_size] = z.gather(-1, targets[s : s + chunk_size, None]).squeeze(-1) - lz
            z.sub_(lz[:, None])  # log p
            entropy[s : s + chunk_size] = -(z.exp().mul_(z)).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, logz, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, logz, entropy = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk_size
        acc = logz.dtype
        g_logp = torch.zeros_like(logz) if g_logp is None else g_logp.to(acc)
        g_ent = torch.zeros_like(logz) if g_ent is None else g_ent.to(acc)
        g_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        g_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            lp = F.linear(h, weight).to(acc).div_(tau).sub_(logz[s : s + chunk, None])  # log p
            p = lp.exp()
            ge, gl = g_ent[s : s + chunk, None], g_logp[s : s + chunk, None]
            # grad wrt z: -g_ent * p * (log p + H) - g_logp * p + g_logp * onehot(target)
            gz = lp.add_(entropy[s : s + chunk, None]).mul_(p).mul_(-ge).sub_(p.mul_(gl))
            del p
            gz.scatter_add_(-1, targets[s : s + chunk, None], gl)
            gz.div_(tau)
            if g_hidden is not None:
                g_hidden[s : s + chunk] = (gz.to(weight.dtype) @ weight).to(hidden.dtype)
            if g_weight is not None:
                g_weight.addmm_(gz.t(), h.to(acc))
            del gz
        return g_hidden, (g_weight.to(weight.dtype) if g_weight is not None else None), None, None, None


def logp_entropy_from_hidden(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int = 1024):
    """`ChunkedLogpEntropy` through the output layer `head` (an nn.Linear without bias).

    The computation runs as `head`'s own forward, so that hooks on the module (DeepSpeed ZeRO-3
    gathers a partitioned weight in them) see it. hidden: (..., H); targets: (...) -> two (...) tensors.
    """
    if getattr(head, "bias", None) is not None:
        raise ValueError("the output layer has a bias; the chunked log-prob computation supports none")
    shape = targets.shape

    def forward(h, t):
        return ChunkedLogpEntropy.apply(h.reshape(-1, h.shape[-1]), head.weight, t.reshape(-1), temperature, chunk_size)

    head.forward = forward
    try:
        logp, entropy = head(hidden, targets)
    finally:
        del head.forward  # back to the class's forward
    return logp.view(shape), entropy.view(shape)


def naive_logp_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    """The plain computation (all logits at once), for tests and the benchmark."""
    z = F.linear(hidden, weight).to(torch.promote_types(weight.dtype, torch.float32)) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
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
    the full-vocabulary entropy (B, L-1) of that next-token distribution (None if `with_entropy`
    is False). Memory holds `chunk_size` positions x vocab floats at a time (`ChunkedLogpEntropy`).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state[:, :-1]
    logp, entropy = logp_entropy_from_hidden(model.lm_head, hidden, input_ids[:, 1:], temperature, chunk_size)
    return logp, (entropy if with_entropy else None)
