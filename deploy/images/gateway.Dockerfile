# ursula-gateway image: built in a Rust image, run on a slim Debian base as a non-root user.
# docker build -f deploy/images/gateway.Dockerfile -t ursula/ursula-gateway:0.1.0 .
FROM rust:1.90-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ursula-gateway --bin ursula-gateway

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home ursula \
 && apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ursula-gateway /usr/local/bin/ursula-gateway
USER 10001
EXPOSE 4437 4438
ENTRYPOINT ["/usr/local/bin/ursula-gateway"]
