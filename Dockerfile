# Build stage: dependencies are compiled in their own layer, so a source
# change rebuilds only the crate itself.
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src bench && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in idle_conns queue_bench; do echo 'fn main() {}' > bench/$b.rs; done \
    && cargo build --release --locked --bin ackproxy || true
COPY src ./src
COPY lua ./lua
COPY config ./config
COPY bench ./bench
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin ackproxy

# Runtime stage: the binary, and redis-server for the embedded default
# (used only when no upstream is configured).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/ackproxy --create-home ackproxy
COPY --from=builder /src/target/release/ackproxy /usr/local/bin/ackproxy
COPY config/ackproxy.toml /etc/ackproxy/ackproxy.toml
USER ackproxy
WORKDIR /var/lib/ackproxy
EXPOSE 6380
ENTRYPOINT ["ackproxy"]
CMD ["--listen", "0.0.0.0:6380"]
