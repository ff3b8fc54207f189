# The operator image for those with a container engine: the `redpilot`
# binary and the metrics sidecar's `redpilot-exporter` (glibc, dynamically
# linked) on a distroless base that holds its
# shared libraries, CA certificates and the nonroot user, run as UID 65532.
#
#   docker build -t quay.io/redpilot/redpilot:$(VERSION) .
#
# `make image` builds the same image without a container engine
# (hack/image.sh: the binary, exactly the libraries it loads, CA
# certificates, the nonroot user; reproducible). tests/image.rs checks that
# both say the same entrypoint, command, user and port. The bundle's
# Deployment runs `/redpilot run`, the entrypoint below, as UID 65532 with a
# read-only root filesystem. TLS is rustls with ring: no OpenSSL is loaded.

# --- build
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
# The workspace: the operator crate and the dev-only localnode member (its
# manifest must be present for Cargo to read the workspace).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY dev/localnode ./dev/localnode
RUN cargo build --release --locked --bin redpilot --bin redpilot-exporter \
	&& cp target/release/redpilot /redpilot \
	&& cp target/release/redpilot-exporter /redpilot-exporter \
	&& /redpilot version

# --- run: no shell, no package manager; glibc, libgcc, CA certificates and
# the nonroot user come with the base.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /redpilot /redpilot
# The metrics sidecar the operator adds to every Redis pod runs
# `redpilot-exporter`, looked up on the PATH.
COPY --from=build /redpilot-exporter /usr/local/bin/redpilot-exporter
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/redpilot"]
CMD ["run"]
