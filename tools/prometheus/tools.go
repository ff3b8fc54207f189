//go:build tools

// Package tools pins Prometheus and promtool: the insights suites scrape the
// dev cluster with them, evaluate Redpilot's alert rules and run the rule
// unit tests.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
