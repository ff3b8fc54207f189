# The catalog image: opm serving Redpilot's file-based catalog (catalog/).
#
#   make catalog && docker build -f catalog.Dockerfile -t quay.io/redpilot/redpilot-catalog:latest .
#
# Not built by `make test` (no container engine here); `make test` serves the
# same directory with `bin/opm serve` and installs from it through OLM.
# The opm version matches tools/opm/go.mod.
FROM quay.io/operator-framework/opm:v1.73.0
ENTRYPOINT ["/bin/opm"]
CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]
COPY catalog /configs
# Pre-build the serving cache so the pod starts fast; fails the build when the
# catalog is invalid.
RUN ["/bin/opm", "serve", "/configs", "--cache-dir=/tmp/cache", "--cache-only"]
LABEL operators.operatorframework.io.index.configs.v1=/configs
