//go:build tools

// Package tools pins grpc_health_probe.
package tools

import (
	_ "github.com/grpc-ecosystem/grpc-health-probe"
)
