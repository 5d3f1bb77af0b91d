"""A small client of the controller's REST API (what the `magic` CLI and `magic local` use).

Errors come back as `ClientError` with a message meant for a person: the controller is
unreachable (and how to point at it), the token is missing or wrong (and where it comes from),
or which field of a request is invalid and why.
"""

from __future__ import annotations

from typing import Any

import httpx

from magic.controller.settings import ClientSettings
from magic.runtime import httpclient


class ClientError(RuntimeError):
    """A request failed; `str()` says why in words, `status` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def format_detail(detail: Any) -> str:
    """FastAPI's error detail as lines: a string, or `loc: msg` per validation error."""
    if isinstance(detail, list):
        lines = []
        for err in detail:
            if isinstance(err, dict):
                loc = [str(x) for x in err.get("loc", []) if x != "body"]
                lines.append(f"  {'.'.join(loc) or 'body'}: {err.get('msg', err)}")
            else:
                lines.append(f"  {err}")
        return "\n".join(lines)
    return str(detail)


class ControllerClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0):
        """`url` and `token` default to `ClientSettings` (MAGIC_CONTROLLER_URL, MAGIC_API_TOKEN)."""
        settings = ClientSettings()
        self.url = (url or settings.controller_url).rstrip("/")
        if token is None and settings.api_token is not None:
            token = settings.api_token.get_secret_value()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.has_token = bool(token)
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, limits=httpclient.LIMITS)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------

    def request(self, method: str, path: str, **kw) -> Any:
        try:
            resp = httpclient.send(self.http, method, path, idempotent=method == "GET", **kw)
        except httpx.ConnectError as exc:
            raise ClientError(
                f"cannot reach the controller at {self.url} ({exc}).\n"
                "Is it running? Point the CLI at it with --url or MAGIC_CONTROLLER_URL "
                "(on Kubernetes: kubectl port-forward svc/<release>-magic-controller 8080:8080)."
            ) from None
        except httpx.TimeoutException:
            raise ClientError(f"the controller at {self.url} did not answer {method} {path} in time") from None
        except httpx.HTTPError as exc:
            raise ClientError(f"request to the controller at {self.url} failed: {exc}") from None
        if resp.status_code == 401:
            why = "no token was sent" if not self.has_token else "the token was refused"
            raise ClientError(
                f"the controller refused {method} {path}: {why} (HTTP 401).\n"
                "Set MAGIC_API_TOKEN (or --token) to the controller's token; on Kubernetes: "
                "kubectl get secret <release>-magic-auth -o jsonpath='{.data.api-token}' | base64 -d",
                401,
            )
        if resp.status_code >= 400:
            try:
                detail = format_detail(resp.json().get("detail", resp.text))
            except ValueError:
                detail = resp.text
            kind = {400: "bad request", 404: "not found", 409: "conflict", 422: "invalid request"}.get(resp.status_code, "error")
            sep = "\n" if "\n" in detail or detail.startswith("  ") else " "
            raise ClientError(f"{kind} (HTTP {resp.status_code}):{sep}{detail}", resp.status_code)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def get(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw) -> Any:
        return self.request("POST", path, json=body, **kw)

    # -- resources ---------------------------------------------------------------------------

    def ready(self) -> bool:
        try:
            return httpclient.send(self.http, "GET", "/readyz", idempotent=True).status_code == 200
        except httpx.HTTPError:
            return False

    def register_dataset(self, name: str, path: str, fmt: str = "auto", replace: bool = False) -> dict:
        return self.post("/v1/datasets", {"name": name, "path": path, "format": fmt}, params={"replace": "true"} if replace else None)

    def datasets(self) -> list[dict]:
        return self.get("/v1/datasets")

    def create_run(self, spec: dict) -> dict:
        return self.post("/v1/runs", spec)

    def runs(self) -> list[dict]:
        return self.get("/v1/runs")

    def run(self, run: str) -> dict:
        return self.get(f"/v1/runs/{run}")

    def metrics(self, run: str, since: int = 0) -> list[dict]:
        return self.get(f"/v1/runs/{run}/metrics", params={"since": since})

    def start_stage(self, run: str, stage: dict) -> dict:
        return self.post(f"/v1/runs/{run}/stages", stage)

    def submit_plan(self, run: str, stages: list[dict], on_plan_end: str | None = None) -> dict:
        """Append `stages`; `on_plan_end` None leaves the API's default."""
        body = {"stages": stages} if on_plan_end is None else {"stages": stages, "on_plan_end": on_plan_end}
        return self.post(f"/v1/runs/{run}/plan", body)

    def action(self, run: str, what: str) -> dict:
        return self.post(f"/v1/runs/{run}/{what}")

    def create_eval(self, run: str, body: dict) -> dict:
        """Queue an evaluation of the run's current policy (`EvalConfig`); its record (with its id)."""
        return self.post(f"/v1/runs/{run}/evals", body)

    def eval(self, run: str, eval_id: str) -> dict:
        return self.get(f"/v1/runs/{run}/evals/{eval_id}")
