# syntax=docker/dockerfile:1.7
# A reward worker: the math verifier and the sandboxed code runner. CPU only; the chart gives its
# pods no network egress but DNS and Redis.
#   docker build -f docker/reward.Dockerfile -t magic-reward:0.1.0 .     (from the repository root)
# Runs as user 10001 with a read-only root filesystem (the chart mounts /tmp and /home/magic).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/magic \
 && /opt/magic/bin/pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY services ./services
RUN /opt/magic/bin/pip install .

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
COPY --from=build /opt/magic /opt/magic
ENV PATH=/opt/magic/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/magic \
    MAGIC_METRICS_PORT=9400
USER 10001:10001
EXPOSE 8080 9400
ENTRYPOINT ["magic"]
CMD ["serve", "reward"]
