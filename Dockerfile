# syntax=docker/dockerfile:1
# Build stage. Dependencies are compiled first, against placeholder sources,
# in a layer of their own: a change to the proxy's code rebuilds only the
# crate itself.
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml names the benchmark files, so they must exist to build at all.
RUN mkdir -p src bench \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > bench/idle_conns.rs \
    && echo 'fn main() {}' > bench/queue_bench.rs \
    && cargo build --release --locked --bin ackproxy \
    && rm -rf src bench
COPY src ./src
COPY lua ./lua
COPY config ./config
COPY bench ./bench
# touch: the placeholders' build must not look newer than the real sources.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin ackproxy \
    && strip target/release/ackproxy

# Runtime stage: the binary, and redis-server for the embedded default
# (started only when no upstream is configured).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/ackproxy \
       --create-home --shell /usr/sbin/nologin ackproxy
COPY --from=builder /src/target/release/ackproxy /usr/local/bin/ackproxy
# An example: use it with --config /etc/ackproxy/ackproxy.toml.
COPY config/ackproxy.toml /etc/ackproxy/ackproxy.toml
COPY docker/healthcheck.sh /usr/local/bin/ackproxy-healthcheck
USER ackproxy
WORKDIR /var/lib/ackproxy
EXPOSE 6380
# The operations server, inside the container only, for the health check
# (the image has bash but no curl: the check speaks HTTP over /dev/tcp).
# Liveness, not readiness: an unhealthy container may be restarted, which
# would not bring an unreachable Redis back (/readyz says that).
ENV ACKPROXY_METRICS=127.0.0.1:7380
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["ackproxy-healthcheck"]
ENTRYPOINT ["ackproxy"]
CMD ["--listen", "0.0.0.0:6380"]
