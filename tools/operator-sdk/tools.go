//go:build tools

// Package tools pins operator-sdk and the scorecard-test binary built by the
// Makefile.
package tools

import (
	_ "github.com/operator-framework/operator-sdk/cmd/operator-sdk"
	_ "github.com/operator-framework/operator-sdk/images/scorecard-test"
)
