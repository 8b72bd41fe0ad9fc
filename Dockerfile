# abridge as a container image.
#
# Built exactly as the native build (docs/src/deployment.md: `cargo build --release
# --locked`, the build step of `cargo run --release`), then copied alone onto a
# distroless Debian 12 base: glibc and libgcc, no shell, no package manager, a non-root
# user. TLS roots for the upstream and for rediss:// are compiled in (rustls +
# webpki-roots), so the image needs no CA bundle.
# Configuration comes from the environment (ABRIDGE_*, see config/abridge.toml).
#
#   docker build -t abridge .
#   docker run --rm -p 8080:8080 -e ABRIDGE_UPSTREAM=https://api.openai.com/v1 abridge
#
# No BuildKit-only syntax, so the classic builder (and docker-compose 1.x) builds it too.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/abridge /usr/local/bin/abridge
# Listen on every interface of the container; publish only the proxy port. The admin
# listener serves /healthz (used below) and, with ABRIDGE_ADMIN__TOKEN, /admin/*.
ENV ABRIDGE_LISTEN=0.0.0.0:8080 \
    ABRIDGE_ADMIN__LISTEN=0.0.0.0:9090
EXPOSE 8080 9090
# nonroot (uid 65532) in the distroless image; stated again so nothing overrides it.
USER 65532:65532
# The binary asks its own admin listener for /healthz: no curl or shell needed.
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/abridge", "--healthcheck"]
ENTRYPOINT ["/usr/local/bin/abridge"]
