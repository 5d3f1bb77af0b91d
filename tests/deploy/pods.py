"""A rendered container, run as a process on this machine: what a kubelet would start, with the
few things a pod has and this machine has not given explicitly.

`container_process` turns a container of a rendered pod spec into an argv and an environment the
way Kubernetes does: the image's ENTRYPOINT/CMD (from its Dockerfile) unless `command`/`args` set
them; env in order, `$(VAR)` expanded from the variables before it (unknown references kept
literally, as Kubernetes does), `fieldRef`s from the pod, `secretKeyRef`s from the rendered Secrets.
Then the *node* is mapped onto this machine, and only that:
  - every volume mount is a directory of the test (`volumes`: mount name -> directory; the shared
    ReadWriteMany volume is one directory for every pod), and values naming a mount path point there;
  - the pod's IP and the cluster names in `hosts` are 127.0.0.1 (`hosts`: DNS name -> address);
  - `node_env`: what the node's hardware would set (no GPU here: MAGIC_DEVICE=cpu, DS_ACCELERATOR=cpu)
    and each pod's own port numbers where two pods would share one address here.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def image_defaults(dockerfile: Path) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of a Dockerfile's final stage, exec form."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM "):
            entrypoint, cmd = [], []
        elif line.startswith("ENTRYPOINT "):
            entrypoint = json.loads(line.split(" ", 1)[1])
        elif line.startswith("CMD "):
            cmd = json.loads(line.split(" ", 1)[1])
    return entrypoint, cmd


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion (`$$(VAR)` escapes it)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = _REF.match(text, i)
        if m and m.group(1) in env:
            out.append(env[m.group(1)])
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def secret_value(docs: list[dict], name: str, key: str) -> str:
    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"] == name:
            if key in d.get("stringData", {}):
                return d["stringData"][key]
            if key in d.get("data", {}):
                return base64.b64decode(d["data"][key]).decode()
    raise AssertionError(f"the render has no Secret {name} with key {key}: the pod would not start")


def container_process(
    docs: list[dict],
    pod: dict,
    pod_name: str,
    container: str,
    dockerfile: Path,
    volumes: dict[str, Path],
    hosts: dict[str, str],
    node_env: dict[str, str],
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of `container` of the rendered pod template `pod` as pod `pod_name` here."""
    spec = pod["spec"]
    c = next(x for x in spec["containers"] if x["name"] == container)
    unmapped = [m["name"] for m in c.get("volumeMounts", []) if m["name"] not in volumes]
    assert not unmapped, f"volumes {unmapped} of {container} have no directory here"
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}

    def on_this_machine(value: str) -> str:
        for path, directory in sorted(mounts.items(), key=lambda kv: -len(kv[0])):  # the deepest mount holding it
            if value == path or value.startswith(path.rstrip("/") + "/"):
                value = str(directory) + value[len(path.rstrip("/")):]
                break
        for name, address in hosts.items():
            value = value.replace(name, address)
        return value

    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            value = expand(str(e["value"]), env)
        else:
            src = e["valueFrom"]
            if "fieldRef" in src:
                value = {"metadata.name": pod_name, "status.podIP": "127.0.0.1", "metadata.namespace": pod["metadata"].get("namespace", "")}[src["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in src:
                value = secret_value(docs, src["secretKeyRef"]["name"], src["secretKeyRef"]["key"])
            else:
                raise AssertionError(f"env {e['name']}: {src} is not mapped onto this machine")
        env[e["name"]] = on_this_machine(value)
    env.update(node_env)
    entrypoint, cmd = image_defaults(dockerfile)
    args = c.get("args", []) if ("args" in c or "command" in c) else cmd  # a command replaces the image's CMD too
    argv = [on_this_machine(expand(a, env)) for a in (c.get("command") or entrypoint) + args]
    argv[0] = str(BIN / argv[0]) if (BIN / argv[0]).exists() else shutil.which(argv[0]) or argv[0]
    return argv, env
