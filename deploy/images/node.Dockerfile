# ursula-node image: built in a Rust image, run on a slim Debian base as a non-root user.
# docker build -f deploy/images/node.Dockerfile -t ursula/ursula-node:0.1.0 .
FROM rust:1.90-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ursula-node --bin ursula-node

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home ursula \
 && apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ursula-node /usr/local/bin/ursula-node
USER 10001
EXPOSE 4437 4438 4439
ENTRYPOINT ["/usr/local/bin/ursula-node"]
