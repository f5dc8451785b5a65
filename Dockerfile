# Multi-stage build of flock's binaries; the runtime image carries nft and ip.
# Build: docker build -t flock:dev .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin flockctl \
    && install -D -m 0755 target/release/flockctl /out/flockctl

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables=1.0.6-2+deb12u2 iproute2=6.1.0-3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/flockctl"]
