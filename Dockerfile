# flock's images, from one multi-stage build:
#
#   docker build --target agent -t ghcr.io/flock-cni/flock:dev --build-arg FLOCK_COMMIT=$(git rev-parse --short HEAD) .
#   docker build --target controller -t ghcr.io/flock-cni/flock-controller:dev --build-arg FLOCK_COMMIT=$(git rev-parse --short HEAD) .
#   docker build --target symbols --output type=local,dest=flock-symbols .
#
# agent (the default target): flock-agent (the DaemonSet), flock-cni (installed onto the
# node by the DaemonSet's init container), flockctl, and nft and ip for the agent, which
# runs as root (nftables and routes). controller: flock-controller alone, without nft, as a
# non-root user. symbols: the debug info of both images' (stripped) binaries, written out
# as files. Images cannot be built on the development machines (no container engine):
# tests/deploy.rs checks this file's stages, tests/lint-deploy.sh lints it (hadolint).
#
# Debian 12 (bookworm) to build and to run: the binaries need the glibc they were built
# against, or a newer one.

FROM rust:1.95.0-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

# The dependency recipe: what of the workspace decides its dependencies (manifests, lockfile).
FROM chef AS planner
WORKDIR /src
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
WORKDIR /src
COPY --from=planner /src/recipe.json recipe.json
# The dependencies alone, before any source is copied: this layer is rebuilt only when the
# recipe changes, not on every change of flock's own code.
RUN cargo chef cook --release --locked --recipe-path recipe.json -p flock -p flock-cni
COPY . .
# The commit flock_build_info reports (.git is not in the build context, see .dockerignore).
ARG FLOCK_COMMIT=unknown
# What ships is stripped (flock-agent: 146 MB -> 21 MB); the symbols and line tables
# go to /out/debug, kept by the `symbols` stage below.
RUN cargo build --release --locked -p flock --bin flock-agent --bin flock-controller --bin flockctl --bin flock-socket-keeper -p flock-cni --bin flock-cni \
    && deploy/split-debuginfo.sh target/release /out flock-agent flock-controller flockctl flock-socket-keeper flock-cni

# The debug files of the shipped binaries, as /usr/lib/debug/usr/local/bin/<binary>.debug
# (where gdb looks for them), for a maintainer to resolve a backtrace or core of a release
# (the header's `--target symbols` build writes them out): copy them into a debugging
# container, or give them to addr2line or gdb's symbol-file.
FROM scratch AS symbols
COPY --from=build /out/debug/ /

# flock-controller: the API server is all it talks to; no nft, no root.
FROM debian:12.11-slim AS controller
COPY --from=build /out/flock-controller /usr/local/bin/flock-controller
# The Deployment runs it as this user too (runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/flock-controller"]

# flock-agent, flock-cni and flockctl, with nft and ip. The last stage: `docker build .`
# builds it.
FROM debian:12.11-slim AS agent
# nft no newer than the hosts' (knftables' advice): bookworm's 1.0.6. The suite is pinned
# by the base image; exact package versions are not, as they change with every point
# release and would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables iproute2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/flock-agent /out/flock-cni /out/flockctl /out/flock-socket-keeper /usr/local/bin/
# kubectl's plugin name for the same binary: `kubectl flock explain …`.
RUN ln -s flockctl /usr/local/bin/kubectl-flock
# No glibc fastbins: after the initial list of a large cluster, freed small blocks piled up
# in them made the next large allocation consolidate for ~20 ms — on a pod's ADD path
# (agent_scale at 150k pods: first ADDs p99 28-34 ms with them, 14-22 ms without; same RSS).
ENV GLIBC_TUNABLES=glibc.malloc.mxfast=0
ENTRYPOINT ["/usr/local/bin/flock-agent"]
