# kuryr-cni daemon image, run on every node by
# etc/kubernetes/kuryr-cni-daemonset.yaml.
#
#   docker build -t kuryr-cni:latest .
#
# The image runs the daemon; at start its entrypoint installs the CNI shim, a
# static executable built here from shim/ (Go, standard library only), into the
# host's CNI bin dir, where the runtime executes it: the node needs nothing
# else, no Python.

# The shim, built as tools/build-shim builds it everywhere: Debian's Go, offline.
FROM debian:bookworm-slim AS shim
RUN apt-get update \
    && apt-get install -y --no-install-recommends golang-go \
    && rm -rf /var/lib/apt/lists/*
COPY shim /src/shim
COPY kuryr_cni/version.py /src/kuryr_cni/version.py
COPY tools/build-shim tools/go-env /src/tools/
RUN /src/tools/build-shim /kuryr-cni


# Build wheels for the package and its dependencies, so that the repository
# checkout (.git, tests, docs) never reaches the final image.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY . /src
RUN pip wheel --wheel-dir /wheels /src


FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="kuryr-cni" \
      org.opencontainers.image.description="Kubernetes CNI node daemon" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1

COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --find-links /tmp/wheels kuryr-cni \
    && rm -rf /tmp/wheels

# The shim waits here until the entrypoint copies it to the host.
COPY --from=shim /kuryr-cni /opt/cni-bin-stage/kuryr-cni
COPY tools/container-entrypoint.sh /usr/local/bin/kuryr-cni-entrypoint
RUN chmod 0755 /opt/cni-bin-stage/kuryr-cni /usr/local/bin/kuryr-cni-entrypoint

# Health (/alive, /ready) and metrics (/metrics); with hostNetwork these are
# the node's ports.
EXPOSE 8090 9655
# The daemon's parent (cotyledon) turns SIGTERM into a graceful stop.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kuryr-cni-entrypoint"]
