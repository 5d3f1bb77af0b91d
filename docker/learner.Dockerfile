# syntax=docker/dockerfile:1.7
# The learner: torch on CUDA, DeepSpeed ZeRO across the pod's GPUs, and vLLM's trainer-side
# weight transfer (NCCL broadcast to the rollout pods' vLLM servers).
#   docker build -f docker/learner.Dockerfile -t magic-learner:0.1.0 .     (from the repository root)
# Built on the rollout's vLLM image so that both ends of the weight broadcast run the same torch
# and NCCL. DeepSpeed's CUDA ops are not prebuilt (the image has no nvcc): the learner uses
# torch's fused AdamW. Runs as user 10001.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0

FROM ${VLLM_IMAGE}
ARG DEEPSPEED_VERSION=0.19.8
# the vLLM image installs its packages into the system Python
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 DS_BUILD_OPS=0
RUN python3 -m pip install "deepspeed==${DEEPSPEED_VERSION}"
WORKDIR /src
# the dependencies first, from pyproject.toml alone, never replacing one of vLLM's packages (its
# installed versions constrain the install); then the build fails unless torch, transformers and fastapi
# are the versions `make test-vllm-stack` tests (docker/constraints-vllm.txt)
COPY pyproject.toml ./
COPY docker/constraints-vllm.txt docker/check_versions.py ./
RUN python3 -m pip list --format=freeze --exclude-editable > vllm-image.txt \
 && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; open('requirements.txt', 'w').write('\n'.join(p['dependencies'] + p['optional-dependencies']['learner']))" \
 && python3 -m pip install -r requirements.txt -c vllm-image.txt \
 && python3 check_versions.py constraints-vllm.txt
COPY README.md ./
COPY proto ./proto
COPY services ./services
RUN python3 -m pip install --no-deps . && rm -rf /src
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
WORKDIR /home/magic
ENV PYTHONUNBUFFERED=1 HOME=/home/magic HF_HOME=/home/magic/.cache/huggingface \
    TRITON_CACHE_DIR=/home/magic/.cache/triton TORCH_EXTENSIONS_DIR=/home/magic/.cache/torch_extensions \
    MAGIC_METRICS_PORT=9400 MAGIC_DEVICE=cuda
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["magic"]
CMD ["serve", "learner"]
