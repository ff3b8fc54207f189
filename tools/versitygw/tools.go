//go:build tools

// Package tools pins the S3 server the backup suites store backups in.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
