# syntax=docker/dockerfile:1
# Build stage. Dependencies are compiled first, against placeholder sources,
# in a layer of their own: a change to the proxy's code rebuilds only the
# crate itself.
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml names the benchmark files, so they must exist to build at all:
# an empty main for each one it names.
RUN mkdir -p src bench \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && for f in $(grep -o 'bench/[a-z_]*\.rs' Cargo.toml); do echo 'fn main() {}' > "$f"; done \
    && cargo build --release --locked --bin ackproxy \
    && rm -rf src bench
COPY build.rs ./
COPY src ./src
COPY lua ./lua
COPY config ./config
COPY bench ./bench
# The build context has no .git: `ackproxy --version` names the commit
# given here (docker build --build-arg ACKPROXY_GIT_COMMIT=$(git rev-parse
# --short HEAD) .), or none.
ARG ACKPROXY_GIT_COMMIT=
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
       --create-home --shell /usr/sbin/nologin ackproxy \
    && install -d -o ackproxy -g ackproxy -m 0750 /var/lib/ackproxy/data
COPY --from=builder /src/target/release/ackproxy /usr/local/bin/ackproxy
# Listens on 0.0.0.0 (6380, and 7380 for the operations server), without
# queue rules until ACKPROXY_QUEUES or a file mounted here gives them.
COPY docker/ackproxy.toml /etc/ackproxy/ackproxy.toml
# Every setting, commented: a starting point for a file of your own.
COPY config/ackproxy.toml /usr/share/doc/ackproxy/ackproxy.toml.example
COPY docker/healthcheck.sh /usr/local/bin/ackproxy-healthcheck
USER ackproxy
WORKDIR /var/lib/ackproxy
# Where the private redis-server keeps its append-only file when
# ACKPROXY_EMBEDDED_PERSISTENCE=true: mount a volume here to keep it.
ENV ACKPROXY_EMBEDDED_DIR=/var/lib/ackproxy/data
EXPOSE 6380 7380
# Liveness, not readiness: an unhealthy container may be restarted, which
# would not bring an unreachable Redis back (/readyz says that). The check
# asks /healthz at $ACKPROXY_METRICS, else at 127.0.0.1:7380 (the image has
# bash but no curl: it speaks HTTP over /dev/tcp).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["ackproxy-healthcheck"]
ENTRYPOINT ["ackproxy"]
CMD ["--config", "/etc/ackproxy/ackproxy.toml"]
