#!/usr/bin/env bash
# Generates Redpilot's OLM bundle: bundle/manifests (the ClusterServiceVersion,
# the CRD), bundle/metadata/annotations.yaml, bundle/tests/scorecard/config.yaml
# and bundle.Dockerfile.
#
#   hack/bundle.sh [VERSION]      (make bundle VERSION=x.y.z)
#
# VERSION defaults to the crate's version in Cargo.toml. Inputs, all read at
# generation time so the bundle follows the repository:
#   config/manifests/bases/redpilot.clusterserviceversion.yaml   CSV metadata
#   config/manifests/deployment.yaml      the operator's Deployment
#   config/manifests/icon/redpilot.svg    the icon (embedded as base64)
#   config/manifests/created-at           createdAt per version
#   crds/*.yaml                           owned CRDs
#   config/rbac/*.yaml                    permissions (see below)
#   config/samples/*.yaml                 alm-examples
#   scorecard/config.yaml                 the scorecard configuration
# operator-sdk (bin/, `make tools-operator-sdk`) does the assembling. It turns
# the rules of config/rbac/ bound to the ServiceAccount into the CSV's
# install strategy by how they are bound: by a RoleBinding (a Role, or a
# ClusterRole used as a template) into `permissions`, which OLM grants only in
# the OperatorGroup's target namespaces (cluster-wide only for an
# AllNamespaces install); by a ClusterRoleBinding into `clusterPermissions`,
# granted in every namespace whatever the install mode. Everything the
# operator does is namespaced, so config/rbac/ has no ClusterRoleBinding and
# the CSV no clusterPermissions; the script refuses a CSV that grants access
# to Secrets cluster-wide. The output
# is deterministic: createdAt comes from config/manifests/created-at, and a
# version generated for the first time gets a line there.
#
# Environment: BUNDLE_DIR (default bundle), BUNDLE_DOCKERFILE (default
# bundle.Dockerfile), IMAGE_REPO (default quay.io/redpilot/redpilot),
# CREATED_AT (overrides the file; nothing is recorded then), CHANNELS
# (default: the catalog's six, candidate,candidate-v0,fast,fast-v0,stable,
# stable-v0), DEFAULT_CHANNEL (default stable-v0, the catalog's). The bundle's
# channel labels are informational: OLM reads the channels of the file-based
# catalog (make catalog, from catalog/releases.txt).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:-${VERSION:-}}
if [[ -z $version ]]; then
	version=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml)
fi
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "bundle: '$version' is not a semantic version (x.y.z)" >&2
	exit 2
fi
bundle_dir=${BUNDLE_DIR:-bundle}
dockerfile=${BUNDLE_DOCKERFILE:-bundle.Dockerfile}
image_repo=${IMAGE_REPO:-quay.io/redpilot/redpilot}
channels=${CHANNELS:-candidate,candidate-v0,fast,fast-v0,stable,stable-v0}
default_channel=${DEFAULT_CHANNEL:-stable-v0}
manifests=config/manifests
sdk=$root/bin/operator-sdk

fail() {
	echo "bundle: $*" >&2
	exit 1
}
[[ -x $sdk ]] || fail "bin/operator-sdk is missing: run 'make tools-operator-sdk' (or 'make tools')"
for d in crds config/rbac config/samples; do
	compgen -G "$d/*.yaml" >/dev/null || fail "no manifests in $d/"
done

# createdAt: fixed per version.
created_at=${CREATED_AT:-}
if [[ -z $created_at ]]; then
	created_at=$(awk -v v="$version" '$1 == v {print $2; exit}' "$manifests/created-at")
	if [[ -z $created_at ]]; then
		created_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
		echo "$version $created_at" >>"$manifests/created-at"
		echo "bundle: recorded createdAt $created_at for $version in $manifests/created-at"
	fi
fi

# The ServiceAccount the Deployment runs as is the one config/rbac/ binds.
sa=$(awk '/^kind: *ServiceAccount/ {sa = 1} sa && /^  name:/ {print $2; exit}' config/rbac/*.yaml | tr -d '"')
[[ -n $sa ]] || fail "no ServiceAccount in config/rbac/"

sdk_version=$(awk '$1 == "require" && $2 == "github.com/operator-framework/operator-sdk" {print $3} $1 == "github.com/operator-framework/operator-sdk" {print $2}' tools/operator-sdk/go.mod | head -1)
image=$image_repo:$version
icon=$(base64 -w0 "$manifests/icon/redpilot.svg")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Everything operator-sdk needs, as one stream of YAML documents.
subst() {
	sed -e "s|@VERSION@|$version|g" -e "s|@IMAGE@|$image|g" -e "s|@CREATED_AT@|$created_at|g" \
		-e "s|@ICON_BASE64@|$icon|g" -e "s|@SERVICE_ACCOUNT@|$sa|g" \
		-e "s|@SCORECARD_IMAGE@|quay.io/operator-framework/scorecard-test:$sdk_version|g" "$1"
}
{
	for f in "$manifests/bases/redpilot.clusterserviceversion.yaml" "$manifests/deployment.yaml" \
		crds/*.yaml config/rbac/*.yaml config/samples/*.yaml scorecard/config.yaml; do
		case ${f##*/} in kustomization.yaml) continue ;; esac
		echo "---"
		subst "$f"
	done
} >"$work/input.yaml"

(
	cd "$work"
	# A pipe on stdin is how operator-sdk is told to read manifests from it.
	cat input.yaml | "$sdk" generate bundle --quiet --overwrite \
		--package redpilot --version "$version" \
		--channels "$channels" --default-channel "$default_channel" \
		--output-dir bundle
)

csv=$work/bundle/manifests/redpilot.clusterserviceversion.yaml
[[ -f $csv ]] || fail "operator-sdk wrote no CSV"
# operator-sdk stamps createdAt with the current time; use the recorded one.
sed -i -E "s|^(    createdAt: ).*|\1\"$created_at\"|" "$csv"
grep -q "createdAt: \"$created_at\"" "$csv" || fail "could not set createdAt in the CSV"

# Least privilege: no Secret access in clusterPermissions, which
# would let an operator installed for one namespace read every Secret of the
# cluster. Bind the rules with a RoleBinding instead (config/rbac/role_binding.yaml).
cluster_secrets=$(awk '
	/^      clusterPermissions:/ {in_cp = 1; next}
	in_cp && /^      [^ -]/ {in_cp = 0}
	in_cp {
		item = $0
		gsub(/["\047]/, "", item)
		if (item ~ /^ *- *(secrets|\*) *$/) print NR": "$0
	}
' "$csv")
[[ -z $cluster_secrets ]] || fail "the CSV grants Secrets (or a wildcard) in clusterPermissions:
$cluster_secrets
bind config/rbac/'s rules with a RoleBinding so that they become permissions"

# bundle.Dockerfile names the bundle directory relative to the repository.
sed -e "s|bundle/|$bundle_dir/|g" "$work/bundle.Dockerfile" >"$work/Dockerfile.out"

rm -rf "$bundle_dir"
mkdir -p "$(dirname "$bundle_dir")"
cp -r "$work/bundle" "$bundle_dir"
cp "$work/Dockerfile.out" "$dockerfile"
echo "bundle: redpilot.v$version in $bundle_dir/ ($dockerfile)"
