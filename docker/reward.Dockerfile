# syntax=docker/dockerfile:1.7
# A reward worker: the math verifier and the sandboxed code runner. CPU only; the chart gives its
# pods no network egress but DNS and Redis.
#   docker build -f docker/reward.Dockerfile -t magic-reward:0.1.0 .     (from the repository root)
# Built and pushed by .github/workflows/images.yml. Runs as user 10001 with a read-only root
# filesystem (the chart mounts /tmp and /home/magic); with reward.sandbox.enabled (the default)
# the chart runs it as root with the few capabilities the code sandbox needs (a uid per slot,
# bubblewrap's namespaces: SYS_ADMIN).

# the official image's multi-platform index, by digest (the tag can be rebuilt)
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/magic
WORKDIR /src
# the dependencies first, from pyproject.toml alone (the base and this service's extra: no torch)
# and at the versions CI tests (docker/constraints.txt): a change to the sources reuses this layer
COPY pyproject.toml ./
COPY docker/constraints.txt docker/check_versions.py ./
RUN /opt/magic/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; open('requirements.txt', 'w').write('\n'.join(p['dependencies'] + p['optional-dependencies']['reward'] + p['optional-dependencies']['codejudge']))" \
 && /opt/magic/bin/pip install -r requirements.txt -c constraints.txt
COPY README.md ./
COPY proto ./proto
COPY services ./services
RUN /opt/magic/bin/pip install --no-deps . \
 && /opt/magic/bin/python check_versions.py constraints.txt --installed

FROM ${PYTHON_IMAGE}
# bubblewrap: the code sandbox's root and namespaces; libseccomp2 (already in the base image, as
# apt's dependency): the seccomp filter, compiled through the pyseccomp binding. Pinned to
# bookworm's versions (a security update replaces them in the archive: then raise the pins).
ARG BUBBLEWRAP_VERSION=0.8.0-2+deb12u1
ARG LIBSECCOMP_VERSION=2.5.4-1+deb12u1
RUN apt-get update \
 && apt-get install -y --no-install-recommends "bubblewrap=${BUBBLEWRAP_VERSION}" "libseccomp2=${LIBSECCOMP_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
COPY --from=build /opt/magic /opt/magic
ENV PATH=/opt/magic/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/magic \
    MAGIC_METRICS_PORT=9400
USER 10001:10001
EXPOSE 8080 9400
ENTRYPOINT ["magic"]
CMD ["serve", "reward"]
