# A CPU worker base image: torch (CPU wheel) plus monarch_spmd with its examples. Extend it with
# your training code, or use any image with Python and torch: the operator ships the worker into
# every pod, so nothing of this project has to be installed for your own programs.
# Build from the repository root:
#   docker build -f images/worker-cpu.Dockerfile -t monarch-spmd/worker-cpu:0.1.0 .
# BASE_IMAGE: any Debian-like image with python (3.11+) and pip on PATH. TORCH_INDEX_URL: where
# pip finds torch; the default is the CPU-only wheel index (scripts/build-images.sh documents
# what it passes where that index is unreachable).
ARG BASE_IMAGE=python:3.11.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Pinned inside pyproject's range (torch>=2.13,<2.15), from the CPU-only wheel index (no CUDA).
RUN pip install torch==2.14.1 --index-url "${TORCH_INDEX_URL}"
# torchft for replica groups (spec.replicaGroups): its Manager for the ranks, and the
# torchft_lighthouse the operator runs in the job's Lighthouse pod. Only those jobs use it.
# TORCHFT_INDEX_URL: PyPI by default (the CPU torch index has no torchft).
ARG TORCHFT_INDEX_URL=https://pypi.org/simple
RUN pip install torchft==0.2.0 --index-url "${TORCHFT_INDEX_URL}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY monarch_spmd ./monarch_spmd
COPY operator ./operator
RUN pip install --no-deps . && rm -rf /src

RUN groupadd --gid 1000 trainer && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash trainer
USER 1000:1000
WORKDIR /home/trainer
