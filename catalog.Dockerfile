# The catalog image: opm serving Redpilot's file-based catalog (catalog/).
#
#   make catalog && docker build -f catalog.Dockerfile -t quay.io/redpilot/redpilot-catalog:latest .
#
# This image carries the checked-in catalog, whose bundles are embedded.
# `make catalog-image` (hack/publish.sh) builds, without a container engine,
# the published catalog image instead: rendered from pushed bundle images,
# each named by digest; `make test` installs through it with OLM.
# The opm version matches tools/opm/go.mod.
FROM quay.io/operator-framework/opm:v1.73.0
ENTRYPOINT ["/bin/opm"]
CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]
COPY catalog /configs
# Pre-build the serving cache so the pod starts fast; fails the build when the
# catalog is invalid.
RUN ["/bin/opm", "serve", "/configs", "--cache-dir=/tmp/cache", "--cache-only"]
LABEL operators.operatorframework.io.index.configs.v1=/configs
