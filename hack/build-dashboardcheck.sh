#!/usr/bin/env bash
# Builds hack/dashboardcheck (Grafana's dashboard schema from grafana-foundation-sdk, Prometheus's
# PromQL parser) once per machine; prints the binary's path on its last line.
exec bash "$(dirname "$0")/build-go-tool.sh" dashboardcheck
