# syntax=docker/dockerfile:1.7
# The learner: torch on CUDA, DeepSpeed ZeRO across the pod's GPUs, and vLLM's trainer-side
# weight transfer (NCCL broadcast to the rollout pods' vLLM servers).
#   docker build -f docker/learner.Dockerfile -t magic-learner:0.1.0 .     (from the repository root)
# Built on the rollout's vLLM image so that both ends of the weight broadcast run the same torch
# and NCCL. DeepSpeed's CUDA ops are not prebuilt (the image has no nvcc): the learner uses
# torch's fused AdamW. Runs as user 10001. Built and pushed by .github/workflows/images.yml.

# NOT YET PINNED BY DIGEST, as in docker/rollout.Dockerfile (the same image: keep them equal)
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
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 DS_BUILD_OPS=0
WORKDIR /src
# the dependencies first, from pyproject.toml alone (the base, this service's extra and the
# deepspeed extra), never replacing one of vLLM's packages (its installed versions constrain the
# install) and pinning what they add, DeepSpeed included (docker/constraints-vllm.txt); then the
# build fails unless torch, transformers and fastapi are the versions `make test-vllm-stack` tests,
# or a package the install added is unpinned
COPY pyproject.toml ./
COPY docker/constraints-vllm.txt docker/check_versions.py ./
RUN python3 -m pip list --format=freeze --exclude-editable > vllm-image.txt \
 && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; e = p['optional-dependencies']; open('requirements.txt', 'w').write('\n'.join(p['dependencies'] + e['learner'] + e['deepspeed']))" \
 && python3 -m pip install -r requirements.txt -c vllm-image.txt -c constraints-vllm.txt \
 && python3 check_versions.py constraints-vllm.txt torch transformers fastapi deepspeed \
 && python3 check_versions.py constraints-vllm.txt --installed --base vllm-image.txt
COPY --from=wheel /wheels /wheels
RUN python3 -m pip install --no-deps /wheels/*.whl && rm -rf /wheels /src
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
WORKDIR /home/magic
ENV PYTHONUNBUFFERED=1 HOME=/home/magic HF_HOME=/home/magic/.cache/huggingface \
    TRITON_CACHE_DIR=/home/magic/.cache/triton TORCH_EXTENSIONS_DIR=/home/magic/.cache/torch_extensions \
    MAGIC_METRICS_PORT=9400 MAGIC_DEVICE=cuda
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["magic"]
CMD ["serve", "learner"]
