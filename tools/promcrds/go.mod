// Wrapper module that pins the prometheus-operator release whose
// monitoring.coreos.com CRDs (ServiceMonitor, PodMonitor, PrometheusRule, ...)
// the insights suites install into the dev cluster. Nothing is built from
// it: tools/build.sh copies example/prometheus-operator-crd/ out of the
// downloaded module.
module redpilot.dev/tools/promcrds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.89.0
