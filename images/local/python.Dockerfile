# A stand-in for python:3.11-slim-bookworm made only from Debian's packages, for machines that
# reach no container registry: scripts/build-images.sh builds it FROM a Debian bookworm root file
# system it makes with debootstrap, and passes it as BASE_IMAGE to images/operator.Dockerfile and
# images/worker-cpu.Dockerfile. Like the official image: python and pip on PATH (Debian
# bookworm's Python is 3.11), pip may install into the system Python.
ARG DEBIAN_IMAGE=monarch-spmd.local/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-pip python3-venv python-is-python3 \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3.*/EXTERNALLY-MANAGED
