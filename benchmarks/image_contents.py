"""What each image's Python environment holds: the installed packages of each service's extra.

    .venv/bin/python benchmarks/image_contents.py                      # the four services
    .venv/bin/python benchmarks/image_contents.py controller reward    # the CPU images only

For each service, a fresh venv in a temporary directory gets what its Dockerfile installs into
the image's Python (`magic-rl[<extra>]` at docker/constraints.txt's versions; the learner adds the
`deepspeed` extra; torch's CPU wheel first where the extra needs torch, as the Makefile does: the
GPU images take CUDA torch and vLLM from vLLM's image instead). Printed per service: the packages,
the size of site-packages (bytecode not compiled; pip and setuptools included), the largest
packages, and whether importing every module of the service and of the shared packages loads
torch or transformers (the controller's and the reward's images must not need either).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {"controller": "controller", "reward": "reward", "rollout": "rollout", "learner": "learner,deepspeed"}
TORCH = "torch==2.13.0"  # the Makefile's TORCH_SPEC

IMPORT_ALL = """
import importlib, json, pkgutil, sys
names = []
for pkg in ("magic.{service}", "magic.config", "magic.store", "magic.protocol", "magic.observability", "magic.runtime"):
    module = importlib.import_module(pkg)
    names += [m.name for m in pkgutil.walk_packages(module.__path__, pkg + ".") if not m.name.endswith("__main__")]
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
print(json.dumps({{"modules": len(names), "failed": failed, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}}))
"""


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def measure(service: str, work: Path) -> dict:
    venv = work / service
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check"]
    if service in ("rollout", "learner"):
        subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "-c", str(ROOT / "docker" / "constraints.txt"), f"{ROOT}[{EXTRAS[service]}]"], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    tops = sorted(((size_mb(d), d.name) for d in site.iterdir() if d.is_dir() and not d.name.endswith((".dist-info", "__pycache__"))), reverse=True)
    dists = len(list(site.glob("*.dist-info")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_ALL.format(service=service)], capture_output=True, text=True, env=env, cwd=work, timeout=600)
    imports = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}
    return {"service": service, "packages": dists, "site_packages_mib": round(size_mb(site)), "largest": [(n, round(s)) for s, n in tops[:4]], "imports": imports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("services", nargs="*", default=list(EXTRAS), choices=list(EXTRAS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magic-images-") as tmp:
        for service in args.services:
            print(json.dumps(measure(service, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
