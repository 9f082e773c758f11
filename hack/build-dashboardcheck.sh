#!/usr/bin/env bash
# Builds hack/dashboardcheck (Grafana's dashboard schema from grafana-foundation-sdk, Prometheus's
# PromQL parser) once per machine. The binary lands in ~/.cache/mtrl/dashboardcheck-<hash of its
# sources>/, so an edit to the checker or a new pin builds a new one. Prints the binary's path on
# its last line.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/dashboardcheck" && pwd)"
KEY=$(cd "${SRC}" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
BIN="${HOME}/.cache/mtrl/dashboardcheck-${KEY}/dashboardcheck"
if [ ! -x "${BIN}" ]; then
  command -v go >/dev/null || { echo "go toolchain not found; install Go >= 1.26.7" >&2; exit 1; }
  mkdir -p "$(dirname "${BIN}")"
  # A private temporary name, then a rename: concurrent builds never see half a binary.
  tmp=$(mktemp "${BIN}.XXXXXX")
  (cd "${SRC}" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "${tmp}" .)
  chmod 0755 "${tmp}" && mv "${tmp}" "${BIN}"
fi
echo "${BIN}"
