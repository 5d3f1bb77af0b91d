"""`VllmEngine`: the rollout engine for GPU pods, driving a vLLM OpenAI-compatible server over HTTP.

Pinned to **vLLM 0.33.0**; every route and field below is from that release:

* generation — `POST /v1/completions` with the prompt as token ids, `n` = gs, `logprobs: 0` (the
  sampled token's logprob only), `return_token_ids` and `return_weight_versions`
  (`CompletionRequest` / `CompletionResponse` in `vllm/entrypoints/openai/completion/protocol.py`).
  Every sampling knob vLLM would otherwise take from the model's generation_config (top_k, min_p,
  penalties) is sent explicitly at its neutral value, so nothing but tau and top-p shapes the
  distribution. Each choice's `weight_versions` spans must all name the version this engine
  loaded: a group that straddles a weight change is refused, never returned.
* logprobs at the sampling temperature — the server must run with
  `--logprobs-mode processed_logprobs` (`LogprobsMode` in `vllm/config/model.py`): vLLM's default
  (`raw_logprobs`) is before the temperature, which would break the PPO ratio. Checked at start
  through `GET /server_info?config_format=json`. With top_p < 1 vLLM's processed logprobs are
  renormalised over the nucleus (the torch engine's are not); the recipe samples with top_p = 1.
* weights from a checkpoint directory (`filesystem`, `http` transports) — `POST /pause?mode=wait`,
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}`
  (`Worker.reload_weights`, vllm/v1/worker/gpu_worker.py), `POST /update_weight_version`,
  `POST /resume` (vllm/entrypoints/serve/dev/rpc/api_router.py, vllm/entrypoints/rl/online/api_router.py).
* weights by NCCL broadcast — `POST /init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update` (vllm/entrypoints/rl/online/api_router.py).

The pause, reload and weight-transfer routes exist only when the server runs with
`VLLM_SERVER_DEV_MODE=1` (vllm/entrypoints/launchers/api_server/routers.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import httpx

from magic.common import modeling
from magic.common.pb import messages_pb2 as pb
from magic.common.weights import Checkpoint
from magic.rollout.engine import GeneratedSample, GenerationRequest, RolloutEngine

log = logging.getLogger(__name__)

VLLM_VERSION = "0.33.0"
FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}


class VllmError(RuntimeError):
    """The vLLM server refused a request or answered something this engine cannot use."""


def completion_request(request: GenerationRequest, request_id: str, model: str | None) -> dict:
    """The body of `POST /v1/completions` for one prompt group."""
    body = {
        "prompt": list(request.prompt_ids),
        "n": request.n,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": int(request.seed) & 0x7FFF_FFFF_FFFF_FFFF,
        "logprobs": 0,
        "return_token_ids": True,
        "return_weight_versions": True,
        "skip_special_tokens": True,
        "request_id": request_id,
        "stream": False,
    }
    if model:
        body["model"] = model
    return body


def parse_completion(response: dict, n: int, version: int) -> list[GeneratedSample]:
    """The n samples of a `CompletionResponse`; raises VllmError when it lacks what training needs."""
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise VllmError(f"expected {n} choices, got {len(choices)}")
    samples = []
    for choice in choices:
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if token_ids is None or logprobs is None:
            raise VllmError("the response lacks token_ids or logprobs.token_logprobs (is the server vLLM >= 0.33 with return_token_ids?)")
        if len(token_ids) != len(logprobs) or any(lp is None for lp in logprobs):
            raise VllmError(f"choice {choice.get('index')}: {len(token_ids)} token ids but logprobs {len(logprobs)} (or missing values)")
        spans = choice.get("weight_versions") or []
        labels = {span.get("version") for span in spans}
        if token_ids and labels != {str(version)}:
            raise VllmError(f"choice {choice.get('index')} was sampled by weight versions {sorted(map(str, labels))}, expected only {version}")
        reason = FINISH_REASONS.get(choice.get("finish_reason"))
        if reason is None:
            raise VllmError(f"choice {choice.get('index')}: unusable finish_reason {choice.get('finish_reason')!r}")
        samples.append(GeneratedSample([int(t) for t in token_ids], [float(x) for x in logprobs], reason, choice.get("text") or ""))
    return samples


class VllmEngine(RolloutEngine):
    """Prompt groups as concurrent completion requests to one vLLM server (its continuous batching
    does the rest); weights through its reload and weight-transfer routes."""

    def __init__(self, base_url: str, model_path: str, model: str | None = None, max_batch_sequences: int = 512, timeout: float = 3600.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_batch_sequences = max_batch_sequences
        self.tokenizer = modeling.load_tokenizer(model_path)
        self.http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=10.0), limits=httpx.Limits(max_connections=max_batch_sequences))
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_batch_sequences), thread_name_prefix="vllm")
        self._futures: dict[str, Future] = {}
        self._sizes: dict[str, int] = {}
        self._request_ids: dict[str, str] = {}
        self._lock = threading.Lock()
        self.version = -1
        self.check_server()

    # -- server ------------------------------------------------------------------------------

    def _post(self, path: str, json: dict | None = None, params: dict | None = None) -> dict:
        resp = self.http.post(path, json=json, params=params)
        if resp.status_code == 404:
            raise VllmError(f"POST {path}: 404 — start the vLLM server with VLLM_SERVER_DEV_MODE=1 (and --weight-transfer-config for NCCL)")
        if resp.status_code >= 400:
            raise VllmError(f"POST {path}: {resp.status_code} {resp.text[:500]}")
        return resp.json() if resp.content else {}

    def check_server(self) -> None:
        """Refuse a server whose logprobs would not be at the sampling temperature."""
        version = self.http.get("/version").json().get("version")
        if version != VLLM_VERSION:
            log.warning("vLLM server is %s; this engine is written against %s", version, VLLM_VERSION)
        resp = self.http.get("/server_info", params={"config_format": "json"})
        if resp.status_code == 404:
            raise VllmError("GET /server_info: 404 — start the vLLM server with VLLM_SERVER_DEV_MODE=1")
        mode = resp.json().get("vllm_config", {}).get("model_config", {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            raise VllmError(f"the vLLM server's logprobs mode is {mode!r}: start it with --logprobs-mode processed_logprobs so logprobs are at the sampling temperature")

    def healthy(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def pause(self) -> None:
        self._post("/pause", params={"mode": "wait"})

    def resume(self) -> None:
        self._post("/resume")

    # -- generation --------------------------------------------------------------------------

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def submit(self, key: str, request: GenerationRequest) -> None:
        if key in self._futures:
            raise ValueError(f"group {key!r} is already in flight")
        request_id = f"magic-{uuid.uuid4().hex}"
        body = completion_request(request, request_id, self.model)
        version = self.version
        self._request_ids[key] = request_id
        self._sizes[key] = request.n
        self._futures[key] = self._pool.submit(self._complete, body, request.n, version)

    def _complete(self, body: dict, n: int, version: int) -> list[GeneratedSample]:
        return parse_completion(self._post("/v1/completions", json=body), n, version)

    def step(self) -> list[tuple[str, list[GeneratedSample] | Exception]]:
        if not self._futures:
            return []
        wait(list(self._futures.values()), timeout=0.2, return_when=FIRST_COMPLETED)
        out = []
        for key in [k for k, f in self._futures.items() if f.done()]:
            future = self._futures.pop(key)
            self._sizes.pop(key, None)
            self._request_ids.pop(key, None)
            try:
                out.append((key, future.result()))
            except (VllmError, httpx.HTTPError) as exc:  # the worker retries or dead-letters the group
                out.append((key, exc))
        return out

    def free_slots(self) -> int:
        return self.max_batch_sequences - sum(self._sizes.values())

    def in_flight(self) -> list[str]:
        return list(self._futures)

    def abort(self, keys: list[str] | None = None) -> list[str]:
        doomed = [k for k in (self._futures if keys is None else keys) if k in self._futures]
        ids = [self._request_ids[k] for k in doomed if not self._futures[k].cancel()]
        if ids:
            self._post("/abort_requests", json={"request_ids": ids})
        for key in doomed:
            self._futures.pop(key)
            self._sizes.pop(key, None)
            self._request_ids.pop(key, None)
        return doomed

    # -- weights -----------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        if self._futures:
            raise RuntimeError(f"cannot switch to v{checkpoint.version} with {len(self._futures)} groups in flight")
        self.pause()
        try:
            self._post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.directory)}})
            self._post("/update_weight_version", json={"new_version": str(checkpoint.version)})
        finally:
            self.resume()
        self.version = int(checkpoint.version)

    def nccl_gpus(self) -> int:
        resp = self.http.get("/get_world_size", params={"include_dp": "true"})
        return int(resp.json()["world_size"]) if resp.status_code == 200 else 0

    def join_nccl_group(self, group: pb.NcclGroup, rank_offset: int) -> None:
        init_info = {
            "master_address": group.master_address,
            "master_port": group.master_port,
            "rank_offset": rank_offset,
            "world_size": group.world_size,
            "packed": group.packed,
        }
        if group.packed:
            init_info |= {"packed_buffer_size_bytes": group.packed_buffer_size_bytes, "packed_num_buffers": group.packed_num_buffers}
        self._post("/init_weight_transfer_engine", json={"init_info": init_info})

    def receive_nccl(self, version: int, update: pb.NcclUpdate) -> None:
        if self._futures:
            raise RuntimeError(f"cannot receive v{version} with {len(self._futures)} groups in flight")
        update_info = {
            "names": [t.name for t in update.tensors],
            "dtype_names": [t.dtype for t in update.tensors],
            "shapes": [list(t.shape) for t in update.tensors],
        }
        self.pause()
        try:
            self._post("/start_weight_update")
            self._post("/update_weights", json={"update_info": update_info})
            self._post("/finish_weight_update", json={"weight_version": str(version)})
        finally:
            self.resume()
        self.version = int(version)

    def close(self) -> None:
        self.abort()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
