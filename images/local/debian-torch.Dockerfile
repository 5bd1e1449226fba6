# A stock image with nothing of this project in it: Debian bookworm with Debian's own python3
# and python3-torch (1.13, CPU, gloo). The real-node tests run an SPMDJob on it to show that the
# worker the operator ships in a ConfigMap is all a pod needs. Built by scripts/build-images.sh.
ARG DEBIAN_IMAGE=monarch-spmd.local/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-torch \
 && rm -rf /var/lib/apt/lists/*
