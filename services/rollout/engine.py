"""Rollout engines: generate gs samples per prompt with a given policy version.

`RolloutEngine` is the contract every engine speaks; `TorchEngine` implements it with plain
torch on CPU (or one GPU): all sequences of a batch — every sample of every group — are decoded
together with a KV cache, left-padded, one token per step.

Sampling follows the recipe: logits are divided by the temperature tau, optionally restricted
to the top-p nucleus, and a token is drawn. The log-probability returned for each sampled token
is log softmax(logits / tau) — before top-p truncation — which is what the learner recomputes,
so the PPO ratio starts at 1 for on-policy data.
"""

from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass, field

import torch

from magic.common import modeling
from magic.common.pb import messages_pb2 as pb
from magic.common.weights import FilesystemWeightStore

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    """One prompt to sample `n` times."""

    prompt_ids: list[int]
    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int = 0


@dataclass
class GeneratedSample:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: int  # pb.FinishReason value
    text: str = ""


@dataclass
class GenerationStats:
    sequences: int = 0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class RolloutEngine(abc.ABC):
    """What the rollout worker needs from an engine."""

    version: int = -1
    """Policy version currently loaded (-1: none yet)."""

    @abc.abstractmethod
    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat prompt with the model's chat template and the generation prompt."""

    @abc.abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> tuple[list[list[GeneratedSample]], GenerationStats]:
        """For each request, `n` samples; all drawn with the currently loaded version."""

    @abc.abstractmethod
    def load_weights(self, update: pb.WeightUpdate) -> None:
        """Switch to the weights announced by `update` (raises if they are incomplete or corrupt)."""


class TorchEngine(RolloutEngine):
    """Batched sampling with a KV cache on a Hugging Face causal LM."""

    def __init__(self, model_path: str, device: str = "cpu", max_batch_sequences: int = 512):
        self.device = torch.device(device)
        self.tokenizer = modeling.load_tokenizer(model_path)
        self.model = modeling.load_model(model_path, self.device)
        self.eos_ids = modeling.eos_token_ids(self.model, self.tokenizer)
        if not self.eos_ids:
            raise ValueError(f"{model_path}: the tokenizer defines no end-of-sequence token")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_batch_sequences = max_batch_sequences
        self.version = -1

    # -- weights -----------------------------------------------------------------------------

    def load_weights(self, update: pb.WeightUpdate) -> None:
        if update.transport != "filesystem":
            raise ValueError(f"the torch engine loads 'filesystem' weights, got {update.transport!r}")
        modeling.load_state_dict(self.model, FilesystemWeightStore.load(update))
        self.version = int(update.version)

    # -- generation --------------------------------------------------------------------------

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return list(ids)

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[list[GeneratedSample]], GenerationStats]:
        t0 = time.perf_counter()
        flat: list[tuple[int, GenerationRequest]] = [(i, r) for i, r in enumerate(requests) for _ in range(r.n)]
        results: list[list[GeneratedSample]] = [[] for _ in requests]
        stats = GenerationStats()
        # batches of whole requests with the same sampling settings, up to max_batch_sequences
        start = 0
        while start < len(flat):
            first = flat[start][1]
            end = start
            while (
                end < len(flat)
                and end - start < self.max_batch_sequences
                and (flat[end][1].temperature, flat[end][1].top_p, flat[end][1].max_tokens)
                == (first.temperature, first.top_p, first.max_tokens)
            ):
                end += 1
            chunk = flat[start:end]
            seed = hash(tuple(r.seed for _, r in chunk[:: max(1, chunk[0][1].n)])) & 0x7FFFFFFF
            samples = self._generate_batch([r.prompt_ids for _, r in chunk], first.temperature, first.top_p, first.max_tokens, seed)
            for (i, _), s in zip(chunk, samples):
                results[i].append(s)
                stats.tokens += len(s.token_ids)
            start = end
        stats.sequences = len(flat)
        stats.seconds = time.perf_counter() - t0
        return results, stats

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], temperature: float, top_p: float, max_tokens: int, seed: int) -> list[GeneratedSample]:
        from transformers import DynamicCache

        dev = self.device
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((batch, width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gen = torch.Generator(device=dev).manual_seed(seed)
        eos = torch.tensor(sorted(self.eos_ids), device=dev)

        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1]
        next_pos = positions[:, -1] + 1
        tokens = torch.zeros((batch, max_tokens), dtype=torch.long, device=dev)
        logps = torch.zeros((batch, max_tokens), dtype=torch.float32, device=dev)
        lengths = torch.full((batch,), max_tokens, dtype=torch.long, device=dev)
        done = torch.zeros(batch, dtype=torch.bool, device=dev)
        for t in range(max_tokens):
            logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
            probs = logp_all.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens[:, t] = tok
            logps[:, t] = logp_all.gather(-1, tok[:, None]).squeeze(1)
            finished_now = ~done & torch.isin(tok, eos)
            lengths = torch.where(finished_now, torch.full_like(lengths, t + 1), lengths)
            done |= finished_now
            if bool(done.all()) or t == max_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=dev)], dim=1)
            out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
            next_pos = next_pos + 1

        samples = []
        tokens_cpu, logps_cpu, lengths_cpu, done_cpu = tokens.cpu(), logps.cpu(), lengths.cpu(), done.cpu()
        for i in range(batch):
            n = int(lengths_cpu[i])
            ids_i = tokens_cpu[i, :n].tolist()
            samples.append(
                GeneratedSample(
                    token_ids=ids_i,
                    logprobs=logps_cpu[i, :n].tolist(),
                    finish_reason=pb.FINISH_REASON_STOP if bool(done_cpu[i]) else pb.FINISH_REASON_LENGTH,
                    text=self.tokenizer.decode(ids_i, skip_special_tokens=True),
                )
            )
        return samples


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out tokens outside the smallest set whose mass reaches `top_p` (probs: (B, V))."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    keep_sorted = cum - sorted_p < top_p  # always keeps the most likely token
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep
