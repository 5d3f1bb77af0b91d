"""Transport `http`: the learner serves its versions over HTTP; rollout workers download them.

For clusters and machines where the learner and the rollout pods share no volume. The learner
writes each version into its own (local) `FilesystemWeightStore` exactly like the filesystem
transport, and a small threaded HTTP server serves the complete versions read-only:

    GET /v000003/model.safetensors      the weights (Content-Length set, sendfile)
    GET /v000003/config.json            the model config

Only complete versions (with their marker) are served, and only those two file names; anything
else is 404. A rollout worker streams the file into a hidden partial file in its cache directory,
hashing as it goes; a short read or a checksum that differs from the announcement raises
`WeightIntegrityError` and nothing is renamed into place, so a half-downloaded version is never
loaded. The cache keeps the two newest versions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from magic.protocol.pb import messages_pb2 as pb
from magic.store.streams import Stream
from magic.weights.base import Checkpoint, CheckpointLoader, WeightIntegrityError, WeightReceiver, WeightSender
from magic.weights.config import HttpTransportConfig
from magic.weights.filesystem import CONFIG_FILE, MARKER, WEIGHTS_FILE, FilesystemWeightStore

log = logging.getLogger(__name__)

TRANSPORT = "http"
_PATH = re.compile(r"^/(v\d{6}(?:-e\d+)?)/(model\.safetensors|config\.json)$")


class WeightServer:
    """Serve the complete versions of `store` on `host:port` from a daemon thread."""

    def __init__(self, store: FilesystemWeightStore, host: str, port: int):
        root = store.root

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                match = _PATH.match(self.path)
                path = root / match.group(1) / match.group(2) if match else None
                if path is None or not (path.parent / MARKER).exists() or not path.is_file():
                    self.send_error(404, "no such complete weight version")
                    return
                with path.open("rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    try:
                        self.wfile.flush()
                        os.sendfile(self.connection.fileno(), f.fileno(), 0, size) if size else None
                    except (BrokenPipeError, ConnectionResetError):
                        pass

            def log_message(self, fmt: str, *args) -> None:
                log.debug("weight server: " + fmt, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="weight-server", daemon=True)
        self._thread.start()
        log.info("weight server on %s:%d serving %s", host, self.port, root)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HttpSender(WeightSender):
    """Write each version into the learner's store, serve it, announce its URL."""

    def __init__(self, run_id: str, store: FilesystemWeightStore, stream: Stream, config_json: str, keep: int, config: HttpTransportConfig):
        self.run_id = run_id
        self.store = store
        self.stream = stream
        self.config_json = config_json
        self.keep = keep
        self.server = WeightServer(store, config.host, config.port)
        self.base_url = (config.advertise_url or f"http://{socket.gethostname()}:{self.server.port}").rstrip("/")

    def publish(self, version: int, state_dict) -> pb.WeightUpdate:
        """`state_dict`: a state dict or `StateBuckets` (written to the served store bucket by bucket)."""
        directory, checksum, size = self.store.write(version, state_dict, self.config_json)
        update = pb.WeightUpdate(
            run_id=self.run_id,
            version=version,
            transport=TRANSPORT,
            uri=f"{self.base_url}/{directory.name}",
            checksum=checksum,
            num_bytes=size,
            published_at=time.time(),
            epoch=self.store.epoch,
        )
        self.stream.add(update)
        self.store.gc(keep=self.keep)
        return update

    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        return self.store.load_version(version)

    def close(self) -> None:
        self.server.close()


class HttpReceiver(WeightReceiver):
    """Download the announced version into a local cache (checked), then have the engine load it."""

    def __init__(self, config: HttpTransportConfig, cache_dir: Path, keep: int = 2):
        self.config = config
        self.cache = FilesystemWeightStore(cache_dir)
        self.keep = keep

    def receive(self, update: pb.WeightUpdate, engine: CheckpointLoader) -> None:
        engine.load_checkpoint(self.download(update))
        self.cache.gc(keep=self.keep)

    def download(self, update: pb.WeightUpdate) -> Checkpoint:
        """Fetch `update` into the cache (unless it is already there) and return its directory."""
        import httpx

        final = self.cache.version_dir(update.version)
        if (final / MARKER).exists():
            try:
                return FilesystemWeightStore.verify(final, update.version, update.checksum, update.num_bytes)
            except WeightIntegrityError:
                shutil.rmtree(final, ignore_errors=True)
        self.cache.root.mkdir(parents=True, exist_ok=True)
        tmp = self.cache.root / f".{final.name}.partial-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            with httpx.Client(timeout=httpx.Timeout(self.config.timeout_seconds, connect=10.0)) as client:
                checksum, size = _fetch(client, f"{update.uri}/{WEIGHTS_FILE}", tmp / WEIGHTS_FILE, update.version)
                _fetch(client, f"{update.uri}/{CONFIG_FILE}", tmp / CONFIG_FILE, update.version)
            if size != update.num_bytes or checksum != update.checksum:
                raise WeightIntegrityError(
                    f"weights v{update.version} from {update.uri}: got {size} bytes with {checksum}, announced {update.num_bytes} bytes with {update.checksum}"
                )
            (tmp / MARKER).write_text(json.dumps({"version": update.version, "checksum": checksum, "num_bytes": size}))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Checkpoint(update.version, final)


def _fetch(client, url: str, dest: Path, version: int) -> tuple[str, int]:
    """Stream `url` into `dest`; returns its sha256 and size. Short reads and HTTP errors raise."""
    import httpx

    h, size = hashlib.sha256(), 0
    try:
        with client.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise WeightIntegrityError(f"weights v{version}: GET {url} answered {resp.status_code}")
            expected = int(resp.headers.get("content-length", -1))
            with dest.open("wb") as f:
                for block in resp.iter_bytes(1 << 20):  # larger chunks re-buffer in httpx and run slower
                    h.update(block)
                    f.write(block)
                    size += len(block)
    except httpx.HTTPError as exc:  # includes a connection closed before Content-Length bytes
        raise WeightIntegrityError(f"weights v{version}: downloading {url} failed: {exc}") from exc
    if expected >= 0 and size != expected:
        raise WeightIntegrityError(f"weights v{version}: {url} ended after {size} of {expected} bytes")
    return "sha256:" + h.hexdigest(), size
