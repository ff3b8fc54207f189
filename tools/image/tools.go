//go:build tools

// Package tools pins crane (the registry and the client the test ground
// uses) to the go-containerregistry release the image tools build on.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
)
