#!/usr/bin/env bash
# Builds a catalog image from a file-based catalog directory and pushes it,
# without a container engine: opm and grpc_health_probe in /bin, the catalog
# in /configs (label operators.operatorframework.io.index.configs.v1), the
# serving cache prebuilt in /tmp/cache, user 1001, `opm serve /configs
# --cache-dir=/tmp/cache` — what OLM's grpc CatalogSource runs (readiness by
# grpc_health_probe). Prints the reference with its digest.
#
#   hack/catalog-image.sh CATALOG_DIR REF
#
# hack/publish.sh runs it on the catalog it renders; tests/olm_e2e.rs also on
# the previous release's catalog, as that release's users had it.
#
# The cache is built here, as `opm generate dockerfile`'s image builds it
# (opm serve checks it against the catalog before it serves). opm's default
# cache backend (pogreb) differs from build to build; its json backend, which
# opm picks for a directory holding cache/ and digest, does not, so the image
# is reproducible (the placeholder digest makes opm build it). Files keep
# their permission bits, which opm's cache digest covers.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: hack/catalog-image.sh CATALOG_DIR REF}
ref=${2:?usage: hack/catalog-image.sh CATALOG_DIR REF}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
fail() {
	echo "catalog-image: $*" >&2
	exit 1
}
for t in opm grpc_health_probe redpilot-dirimage; do
	[[ -x $root/bin/$t ]] || fail "bin/$t is missing: run 'make tools'"
done
[[ -d $dir ]] || fail "no catalog directory at $dir"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy with the modes a checkout gives, so that the cache digest does not
# depend on where the catalog came from.
mkdir "$work/configs"
cp -rL "$dir/." "$work/configs/"
chmod -R u=rwX,go=rX "$work/configs"
mkdir -p "$work/cache/cache"
echo none >"$work/cache/digest"
"$root/bin/opm" serve "$work/configs" --cache-dir="$work/cache" --cache-only >"$work/cache.log" 2>&1 ||
	fail "building the serving cache of $dir: $(tail -5 "$work/cache.log")"
"$root/bin/opm" validate "$work/configs" || fail "opm validate rejected $dir"
out=$("$root/bin/redpilot-dirimage" --push "$ref" --created "$epoch" \
	--add "$(readlink -f "$root/bin/opm"):/bin/opm" \
	--add "$(readlink -f "$root/bin/grpc_health_probe"):/bin/grpc_health_probe" \
	--add "$work/configs:/configs" --add "$work/cache:/tmp/cache" --chown 1001:/tmp/cache \
	--user 1001 --env PATH=/bin \
	--label operators.operatorframework.io.index.configs.v1=/configs \
	--entrypoint '["/bin/opm"]' --cmd '["serve","/configs","--cache-dir=/tmp/cache"]') ||
	fail "pushing $ref"
digest=$(grep -o 'sha256:[0-9a-f]\{64\}' <<<"$out" | tail -1)
[[ -n $digest ]] || fail "no digest in: $out"
echo "${ref%:*}@$digest"
