#!/usr/bin/env bash
# Builds the operator image without a container engine (bin/redpilot-image,
# tools/image/): the binary, the shared libraries it loads (from this
# machine's Debian packages, named in the label dev.redpilot.image.packages),
# CA certificates, and the nonroot user (UID 65532). Same inputs, same
# digest.
#
#   hack/image.sh [BINARY] [OUT]
#
# BINARY  the operator binary (default: the release build, which `make image`
#         makes first); the metrics sidecar's binary, redpilot-exporter,
#         is taken from beside it (EXPORTER overrides; NO_EXPORTER=1 for a
#         release that had none) and goes to /usr/local/bin, on the PATH the
#         sidecar's command is looked up in
# OUT     where to write (default: dist/image):
#           OUT/oci/                  the OCI image layout
#           OUT/redpilot-VERSION.tar  the same image for `docker load`
#           OUT/image.json            reference, digest and sizes
#
# The reference is IMAGE_REPO:VERSION (defaults: quay.io/redpilot/redpilot and
# Cargo.toml's version), as the bundle names it. Every time in the image is
# SOURCE_DATE_EPOCH, else the commit's time.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
binary=${1:-${CARGO_TARGET_DIR:-$root/target}/release/redpilot}
out=${2:-$root/dist/image}
tool=$root/bin/redpilot-image
if [[ ! -x $tool ]]; then
	echo "image: $tool is missing; build it with: make tools-image" >&2
	exit 1
fi
if [[ ! -f $binary ]]; then
	echo "image: no operator binary at $binary (make image builds the release one)" >&2
	exit 1
fi
exporter_args=()
if [[ ${NO_EXPORTER:-} != 1 ]]; then
	exporter=${EXPORTER:-$(dirname "$binary")/redpilot-exporter}
	if [[ ! -f $exporter ]]; then
		echo "image: no redpilot-exporter at $exporter (cargo build --bin redpilot-exporter; make image builds it)" >&2
		exit 1
	fi
	exporter_args=(--exporter "$exporter")
fi
version=${VERSION:-$(awk -F'"' '/^version *=/ {print $2; exit}' "$root/Cargo.toml")}
ref=${IMAGE_REPO:-quay.io/redpilot/redpilot}:$version
created=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)

mkdir -p "$out"
"$tool" --binary "$binary" "${exporter_args[@]}" --tag "$ref" --created "$created" \
	--layout "$out/oci" --tar "$out/redpilot-$version.tar" --json "$out/image.json" \
	--label org.opencontainers.image.title=redpilot \
	--label org.opencontainers.image.version="$version" \
	--label org.opencontainers.image.revision="$revision" \
	--label org.opencontainers.image.licenses=Apache-2.0
echo "image: $out/oci (OCI layout), $out/redpilot-$version.tar (docker load)"
