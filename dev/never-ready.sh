#!/bin/sh
# A "server" for the upgrade tests: starts, never listens, never exits, so
# its pod never becomes Ready (dev/images.yaml: redpilot-test/never-ready).
exec sleep 1000000
