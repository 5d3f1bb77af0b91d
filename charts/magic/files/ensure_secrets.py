"""The chart's pre-install/pre-upgrade hook: create each generated Secret the release needs, once.

A Secret that already exists is left as it is (its value is what the running pods and Redis use);
a missing one is created with a random URL-safe value of the requested length. Helm's ownership
labels and annotations are set on what is created, so that a later `helm upgrade` with the value
given in values adopts the Secret instead of failing. GitOps tools must never delete it (a new
password would then be generated, which the running Redis does not have): Argo CD tracks objects by
the release's app.kubernetes.io/instance label, which the Secret carries, and would prune it as
absent from the rendered manifests; GITOPS_KEEP are the annotations that stop that (Argo CD's
compare and sync options, Flux's kustomize-controller's prune switch).

Input: MAGIC_SECRETS, a JSON list of {"name", "key", "length"}; RELEASE_NAME, RELEASE_NAMESPACE,
and the labels to set as JSON in SECRET_LABELS. Talks to the API server with the pod's
ServiceAccount token (standard library only: runs in any MAGIC image).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import string
import sys
import urllib.error
import urllib.request

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
ALPHABET = string.ascii_letters + string.digits  # URL-safe: the Redis password goes into a redis:// URL


def random_value(length: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


GITOPS_KEEP = {
    "argocd.argoproj.io/compare-options": "IgnoreExtraneous",  # not "OutOfSync" for being absent from Git
    "argocd.argoproj.io/sync-options": "Prune=false",  # never pruned
    "kustomize.toolkit.fluxcd.io/prune": "disabled",  # Flux's garbage collection skips it
}


def secret_manifest(name: str, key: str, value: str, namespace: str, release: str, labels: dict[str, str]) -> dict:
    """The Secret to create, owned by the Helm release (labels and annotations Helm checks before adopting)."""
    import base64

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, "app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace, "helm.sh/resource-policy": "keep", **GITOPS_KEEP},
        },
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


class Api:
    def __init__(self) -> None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}"
        self.token = open(f"{SA}/token").read().strip()
        self.context = ssl.create_default_context(cafile=f"{SA}/ca.crt")

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, method=method, data=json.dumps(body).encode() if body else None)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


def ensure(api: Api, spec: dict, namespace: str, release: str, labels: dict[str, str]) -> str:
    """'kept' or 'created'; raises RuntimeError with the API server's message otherwise."""
    path = f"/api/v1/namespaces/{namespace}/secrets"
    status, found = api.call("GET", f"{path}/{spec['name']}")
    if status == 200:
        if spec["key"] not in (found.get("data") or {}):
            raise RuntimeError(f"Secret {spec['name']} exists but has no key {spec['key']!r}: add it, or delete the Secret to have it generated")
        return "kept"
    if status != 404:
        raise RuntimeError(f"GET Secret {spec['name']}: {status} {found.get('message', '')}")
    body = secret_manifest(spec["name"], spec["key"], random_value(int(spec["length"])), namespace, release, labels)
    status, answer = api.call("POST", path, body)
    if status == 201:
        return "created"
    if status == 409:  # created meanwhile by another run of this hook
        return "kept"
    raise RuntimeError(f"POST Secret {spec['name']}: {status} {answer.get('message', '')}")


def main() -> int:
    wanted = json.loads(os.environ["MAGIC_SECRETS"])
    namespace, release = os.environ["RELEASE_NAMESPACE"], os.environ["RELEASE_NAME"]
    labels = json.loads(os.environ.get("SECRET_LABELS", "{}"))
    api = Api()
    for spec in wanted:
        try:
            print(f"Secret {spec['name']} ({spec['key']}): {ensure(api, spec, namespace, release, labels)}")
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
