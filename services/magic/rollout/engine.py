"""Rollout engines: generate gs samples per prompt with a given policy version.

`RolloutEngine` is the contract every engine speaks. It is built for continuous batching, so a
worker can keep an engine full and pull prompt groups as slots free up (no bucket effect: one
long response does not hold back the groups behind it):

    submit(key, request)  start generating one prompt group (n samples)
    step()                advance; returns the groups that finished since the last call
    free_slots()          sequences that can still be admitted
    abort(keys)           drop groups in flight (their samples are never returned)
    load_checkpoint(c)    serve another weight version (only with nothing in flight)
    pause() / resume()    stop / restart generating (weight updates, draining)
    healthy()             the engine can serve

`generate(requests)` (submit everything, step until done) is built on these for evaluation.

`TorchEngine` implements it with plain torch on CPU (or one GPU): all running sequences — every
sample of every admitted group — are decoded together with one KV cache. A new group's prompt is
prefilled once and its cache copied to its n samples; finished rows leave the batch at once and
new groups join it (the caches are left-padded to a common length and concatenated).

Sampling follows the recipe: logits are divided by the temperature tau, optionally restricted
to the top-p nucleus, and a token is drawn. The log-probability returned for each sampled token
is log softmax(logits / tau) — before top-p truncation — which is what the learner recomputes
(`magic.modeling.token_logprobs`), so the PPO ratio starts at 1 for on-policy data.
Each group draws from its own generator seeded with the request's seed, so a group's samples do
not depend on which other groups share its batch (up to float rounding).
"""

from __future__ import annotations

import abc
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from magic import modeling
from magic.prompts import load_tokenizer, render_prompt
from magic.protocol.pb import messages_pb2 as pb
from magic.weights import WEIGHTS_FILE, Checkpoint

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
    """Generated token ids, the end-of-sequence token included when it stopped."""
    logprobs: list[float]
    """log pi(token) at the sampling temperature, one per token id."""
    finish_reason: int
    """A pb.FinishReason value."""
    text: str = ""
    """Decoded response, special tokens removed."""


@dataclass
class GenerationStats:
    sequences: int = 0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class RolloutEngine(abc.ABC):
    """What the rollout worker needs from an engine."""

    version: int = -1
    """Policy version currently served (-1: none yet)."""

    @abc.abstractmethod
    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat prompt with the model's chat template and the generation prompt."""

    @abc.abstractmethod
    def submit(self, key: str, request: GenerationRequest) -> None:
        """Start generating `request.n` samples of `request`; `key` names it in `step`'s results."""

    @abc.abstractmethod
    def step(self) -> list[tuple[str, list[GeneratedSample] | Exception]]:
        """Advance generation (blocking briefly); the groups finished since the last call, each with
        its samples or, when the engine failed that group alone (a refused request), the error."""

    @abc.abstractmethod
    def free_slots(self) -> int:
        """How many more sequences can be admitted now."""

    @abc.abstractmethod
    def in_flight(self) -> list[str]:
        """Keys of the groups submitted and not yet returned."""

    @abc.abstractmethod
    def abort(self, keys: list[str] | None = None) -> list[str]:
        """Drop the groups `keys` (all when None); returns the keys dropped."""

    @abc.abstractmethod
    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Serve `checkpoint.version` from the weights in `checkpoint.directory` (nothing may be in flight)."""

    def pause(self) -> None:
        """Stop admitting and advancing generation (the torch engine only advances inside step())."""

    def resume(self) -> None:
        """Undo pause()."""

    def healthy(self) -> bool:
        """The engine can serve requests."""
        return True

    def close(self) -> None:
        """Release the engine's resources."""

    def generate(self, requests: list[GenerationRequest]) -> tuple[list[list[GeneratedSample]], GenerationStats]:
        """For each request, `n` samples, all drawn with the current version (a blocking batch)."""
        t0 = time.perf_counter()
        results: dict[str, list[GeneratedSample]] = {}
        pending = deque((str(i), r) for i, r in enumerate(requests))
        while pending or self.in_flight():
            while pending and (self.free_slots() >= pending[0][1].n or not self.in_flight()):
                key, req = pending.popleft()
                self.submit(key, req)
            try:
                finished = self.step()
            except BaseException:
                self.abort()  # never leave the other groups half in flight
                raise
            for key, out in finished:
                if isinstance(out, Exception):
                    self.abort()
                    raise out
                results[key] = out
        ordered = [results[str(i)] for i in range(len(requests))]
        stats = GenerationStats(sequences=sum(len(s) for s in ordered), tokens=sum(len(x.token_ids) for s in ordered for x in s))
        stats.seconds = time.perf_counter() - t0
        return ordered, stats


@dataclass
class _Group:
    key: str
    request: GenerationRequest
    generator: torch.Generator
    samples: dict[int, GeneratedSample] = field(default_factory=dict)  # sample index -> finished sample


@dataclass
class _Rows:
    """The running batch: one row per sample, aligned with the KV cache's batch dimension."""

    group: list[_Group] = field(default_factory=list)
    sample: list[int] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)


class TorchEngine(RolloutEngine):
    """Continuous batched sampling with a KV cache on a Hugging Face causal LM."""

    def __init__(self, model_path: str, device: str = "cpu", max_batch_sequences: int = 512):
        if max_batch_sequences < 1:
            raise ValueError(f"max_batch_sequences must be at least 1, got {max_batch_sequences}")
        self.device = torch.device(device)
        self.tokenizer = load_tokenizer(model_path)
        self.model = modeling.load_model(model_path, self.device)
        self.eos_ids = modeling.eos_token_ids(self.model, self.tokenizer)
        if not self.eos_ids:
            raise ValueError(f"{model_path}: the tokenizer defines no end-of-sequence token")
        self._eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_batch_sequences = max_batch_sequences
        self.version = -1
        self._waiting: deque[_Group] = deque()
        self._groups: dict[str, _Group] = {}
        self._rows = _Rows()
        self._cache = None
        self._mask: torch.Tensor | None = None  # (rows, L) attention mask over the cache
        self._next_pos: torch.Tensor | None = None  # (rows,) position id of the next token
        self._logits: torch.Tensor | None = None  # (rows, V) logits for the next token

    # -- weights -----------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        from safetensors.torch import load_file

        if self._groups:
            raise RuntimeError(f"cannot switch to v{checkpoint.version} with {len(self._groups)} groups in flight")
        modeling.load_state_dict(self.model, load_file(str(checkpoint.directory / WEIGHTS_FILE)))
        self.version = int(checkpoint.version)

    # -- the engine contract -----------------------------------------------------------------

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return render_prompt(self.tokenizer, messages)

    def submit(self, key: str, request: GenerationRequest) -> None:
        if key in self._groups:
            raise ValueError(f"group {key!r} is already in flight")
        if request.n < 1 or request.max_tokens < 1 or request.temperature < 0 or not request.prompt_ids:
            raise ValueError(f"invalid generation request for {key!r}: n={request.n} max_tokens={request.max_tokens} temperature={request.temperature}")
        group = _Group(key, request, torch.Generator(device=self.device).manual_seed(int(request.seed) & 0x7FFF_FFFF_FFFF_FFFF))
        self._groups[key] = group
        self._waiting.append(group)

    def free_slots(self) -> int:
        return self.max_batch_sequences - len(self._rows.group) - sum(g.request.n for g in self._waiting)

    def in_flight(self) -> list[str]:
        return list(self._groups)

    def abort(self, keys: list[str] | None = None) -> list[str]:
        doomed = set(self._groups if keys is None else keys) & set(self._groups)
        self._waiting = deque(g for g in self._waiting if g.key not in doomed)
        keep = [i for i, g in enumerate(self._rows.group) if g.key not in doomed]
        self._select_rows(keep)
        for key in doomed:
            del self._groups[key]
        return sorted(doomed)

    @torch.no_grad()
    def step(self) -> list[tuple[str, list[GeneratedSample]]]:
        self._admit()
        if not self._rows.group:
            return []
        return self._decode_one()

    # -- continuous batching -----------------------------------------------------------------

    def _admit(self) -> None:
        """Prefill waiting groups that fit (at least one when the batch is empty) and join them to the batch."""
        admitted: list[_Group] = []
        room = self.max_batch_sequences - len(self._rows.group)
        while self._waiting and (self._waiting[0].request.n <= room or (not self._rows.group and not admitted)):
            group = self._waiting.popleft()
            room -= group.request.n
            admitted.append(group)
        if admitted:
            self._join(*self._prefill(admitted))

    def _prefill(self, groups: list[_Group]):
        """One forward pass over the groups' prompts (left-padded); the cache is then copied to every sample."""
        from transformers import DynamicCache

        dev = self.device
        prompts = [g.request.prompt_ids for g in groups]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(groups), width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((len(groups), width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        expand = torch.tensor([i for i, g in enumerate(groups) for _ in range(g.request.n)], device=dev)
        cache.batch_select_indices(expand)
        rows = _Rows(
            group=[g for g in groups for _ in range(g.request.n)],
            sample=[j for g in groups for j in range(g.request.n)],
            tokens=[[] for g in groups for _ in range(g.request.n)],
            logprobs=[[] for g in groups for _ in range(g.request.n)],
        )
        return rows, cache, mask[expand], positions[expand, -1] + 1, out.logits[:, -1].float()[expand]

    def _join(self, rows: _Rows, cache, mask: torch.Tensor, next_pos: torch.Tensor, logits: torch.Tensor) -> None:
        if not self._rows.group:
            self._rows, self._cache, self._mask, self._next_pos, self._logits = rows, cache, mask, next_pos, logits
            return
        old_len, new_len = self._mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for old_layer, new_layer in zip(self._cache.layers, cache.layers):
            for name in ("keys", "values"):
                a, b = getattr(old_layer, name), getattr(new_layer, name)
                setattr(old_layer, name, torch.cat([_left_pad(a, width, dim=-2), _left_pad(b, width, dim=-2)], dim=0))
        self._mask = torch.cat([_left_pad(self._mask, width, dim=1), _left_pad(mask, width, dim=1)], dim=0)
        self._next_pos = torch.cat([self._next_pos, next_pos])
        self._logits = torch.cat([self._logits, logits])
        for name in ("group", "sample", "tokens", "logprobs"):
            getattr(self._rows, name).extend(getattr(rows, name))

    def _decode_one(self) -> list[tuple[str, list[GeneratedSample]]]:
        """Sample one token for every row, retire finished rows, run the model on the rest."""
        logp_all = torch.log_softmax(self._logits / self._temperatures(), dim=-1)
        tok = self._sample(logp_all)
        logp = logp_all.gather(-1, tok[:, None]).squeeze(1)
        finished_groups: list[tuple[str, list[GeneratedSample]]] = []
        keep: list[int] = []
        stopped = torch.isin(tok, self._eos).tolist()
        for i, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist())):
            rows = self._rows
            rows.tokens[i].append(t)
            rows.logprobs[i].append(lp)
            group = rows.group[i]
            if stopped[i] or len(rows.tokens[i]) >= group.request.max_tokens:
                reason = pb.FINISH_REASON_STOP if stopped[i] else pb.FINISH_REASON_LENGTH
                text = self.tokenizer.decode(rows.tokens[i], skip_special_tokens=True)
                group.samples[rows.sample[i]] = GeneratedSample(rows.tokens[i], rows.logprobs[i], reason, text)
                if len(group.samples) == group.request.n:
                    del self._groups[group.key]
                    finished_groups.append((group.key, [group.samples[j] for j in range(group.request.n)]))
            else:
                keep.append(i)
        self._select_rows(keep, last_tokens=tok)
        if keep:
            self._mask = torch.cat([self._mask, torch.ones((len(keep), 1), dtype=self._mask.dtype, device=self.device)], dim=1)
            out = self.model(
                input_ids=tok[keep][:, None],
                attention_mask=self._mask,
                position_ids=self._next_pos[:, None],
                past_key_values=self._cache,
                use_cache=True,
            )
            self._logits = out.logits[:, -1].float()
            self._next_pos = self._next_pos + 1
        return finished_groups

    def _temperatures(self) -> torch.Tensor:
        """tau of each row; 1 for a greedy row (tau = 0: its token is the argmax, its log-prob at tau = 1)."""
        return torch.tensor([g.request.temperature or 1.0 for g in self._rows.group], device=self.device)[:, None]

    def _sample(self, logp_all: torch.Tensor) -> torch.Tensor:
        """One token per row, each group from its own generator (rows of a group are contiguous)."""
        probs = logp_all.exp()
        out = torch.empty(probs.shape[0], dtype=torch.long, device=self.device)
        start = 0
        groups = self._rows.group
        while start < len(groups):
            end = start
            while end < len(groups) and groups[end] is groups[start]:
                end += 1
            p = probs[start:end]
            if groups[start].request.temperature == 0:  # greedy (held-out validation at tau = 0)
                out[start:end] = p.argmax(dim=-1)
                start = end
                continue
            if groups[start].request.top_p < 1.0:
                p = _top_p_filter(p, groups[start].request.top_p)
            out[start:end] = torch.multinomial(p, 1, generator=groups[start].generator).squeeze(1)
            start = end
        return out

    def _select_rows(self, keep: list[int], last_tokens: torch.Tensor | None = None) -> None:
        """Keep only rows `keep` (in order) and trim cache columns no remaining row attends to."""
        if len(keep) == len(self._rows.group):
            return
        if not keep:
            self._rows, self._cache, self._mask, self._next_pos, self._logits = _Rows(), None, None, None, None
            return
        idx = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(idx)
        self._mask, self._next_pos, self._logits = self._mask[idx], self._next_pos[idx], self._logits[idx]
        for name in ("group", "sample", "tokens", "logprobs"):
            values = getattr(self._rows, name)
            setattr(self._rows, name, [values[i] for i in keep])
        first = int(self._mask.any(dim=0).long().argmax())
        if first > 0:
            self._mask = self._mask[:, first:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out tokens outside the smallest set whose mass reaches `top_p` (probs: (B, V))."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    keep_sorted = cum - sorted_p < top_p  # always keeps the most likely token
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep
