# The SPMDJob operator image. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t monarch-spmd/operator:0.1.0 .
# Runs as the non-root user 65532 with a read-only root file system (see the Helm chart).
# BASE_IMAGE: any Debian-like image with python (3.11+) and pip on PATH; scripts/build-images.sh
# passes a base it makes from Debian packages on machines that reach no registry.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Pinned inside pyproject's `operator` extra. No Kubernetes client library: the operator speaks
# JSON over aiohttp, and the chart's `helm test` pod (this image) uses the standard library.
RUN pip install kopf==1.45.2 aiohttp==3.14.5 prometheus_client==0.26.0 pyyaml==6.0.3

WORKDIR /src
COPY pyproject.toml README.md ./
COPY monarch_spmd ./monarch_spmd
COPY operator ./operator
# With the `operator` extra: a dependency added there and not pinned above still gets installed.
RUN pip install ".[operator]" && rm -rf /src

RUN groupadd --gid 65532 nonroot && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin nonroot
USER 65532:65532
WORKDIR /tmp

# kopf's health endpoint (liveness and readiness probes).
EXPOSE 8080
ENTRYPOINT ["python", "-m", "spmd_operator"]
CMD ["--all-namespaces"]
