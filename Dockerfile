# The operator image: a static `redpilot` binary on a distroless base, run as
# a non-root user.
#
#   docker build -t quay.io/redpilot/redpilot:$(VERSION) .
#
# This machine has no container engine, so the image is not built by
# `make test`; the file is kept correct by construction (see README.md,
# "OLM packaging"). The bundle's Deployment runs `/redpilot run`, the
# entrypoint below, as UID 65532 with a read-only root filesystem.

# --- build: a statically linked binary (musl; TLS is rustls with ring, so no
# OpenSSL or other C library is linked in).
FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
	&& apt-get install -y --no-install-recommends musl-tools \
	&& rm -rf /var/lib/apt/lists/* \
	&& rustup target add x86_64-unknown-linux-musl
WORKDIR /src
# The workspace: the operator crate and the dev-only localnode member (its
# manifest must be present for Cargo to read the workspace).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY dev/localnode ./dev/localnode
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin redpilot \
	&& cp target/x86_64-unknown-linux-musl/release/redpilot /redpilot \
	&& /redpilot version

# --- run: no shell, no package manager; CA certificates and /etc/passwd
# entries for the nonroot user come with the base.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /redpilot /redpilot
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/redpilot"]
CMD ["run"]
