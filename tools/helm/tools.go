//go:build tools

// Package tools pins Helm: the chart suite lints and renders
// deploy/helm/redpilot with it and installs, upgrades and uninstalls it on
// the dev cluster.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
