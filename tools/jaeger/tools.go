//go:build tools

// Package tools pins Jaeger (all-in-one, OTLP in, query API out): the
// insights suites send the operator's traces to it and read them back.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
