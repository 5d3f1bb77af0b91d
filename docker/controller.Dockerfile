# syntax=docker/dockerfile:1.7
# The controller: FastAPI REST API and the on-policy step barrier. CPU only.
#   docker build -f docker/controller.Dockerfile -t magic-controller:0.1.0 .     (from the repository root)
# Built and pushed by .github/workflows/images.yml. Runs as user 10001 with a read-only root
# filesystem (the chart mounts /tmp and /home/magic).

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
RUN /opt/magic/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; open('requirements.txt', 'w').write('\n'.join(p['dependencies'] + p['optional-dependencies']['controller']))" \
 && /opt/magic/bin/pip install -r requirements.txt -c constraints.txt
COPY README.md ./
COPY proto ./proto
COPY services ./services
RUN /opt/magic/bin/pip install --no-deps . \
 && /opt/magic/bin/python check_versions.py constraints.txt --installed

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 magic && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/magic magic
COPY --from=build /opt/magic /opt/magic
ENV PATH=/opt/magic/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/magic \
    MAGIC_HOST=0.0.0.0 MAGIC_PORT=8080
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["magic"]
CMD ["serve", "controller"]
