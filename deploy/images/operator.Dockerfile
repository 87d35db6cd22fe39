# ursula-operator image: built in a Rust image, run on a slim Debian base as a non-root user.
# docker build -f deploy/images/operator.Dockerfile -t ursula/ursula-operator:0.1.0 .
FROM rust:1.90-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ursula-operator --bin ursula-operator

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home ursula \
 && apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ursula-operator /usr/local/bin/ursula-operator
USER 10001

ENTRYPOINT ["/usr/local/bin/ursula-operator"]
