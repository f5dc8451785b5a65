# flock's image: flock-agent (the DaemonSet), flock-cni (installed onto the node by the
# DaemonSet's init container), flock-controller (the Deployment), flockctl, and nft/ip for
# the agent.
#
# Images cannot be built on the development machines (no container engine); users run:
#   docker build -t ghcr.io/flock-cni/flock:dev .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin flock-agent --bin flock-controller --bin flockctl -p flock --bin flock-cni -p flock-cni \
    && install -D -m 0755 target/release/flock-agent /out/flock-agent \
    && install -D -m 0755 target/release/flock-controller /out/flock-controller \
    && install -D -m 0755 target/release/flock-cni /out/flock-cni \
    && install -D -m 0755 target/release/flockctl /out/flockctl

FROM debian:bookworm-slim
# nft no newer than the hosts' (knftables advice): bookworm's 1.0.6.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables=1.0.6-2+deb12u2 iproute2=6.1.0-3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/flock-agent"]
