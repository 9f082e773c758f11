#!/usr/bin/env bash
# Builds hack/luacheck (Argo CD's health-check runtime: gopher-lua v1.1.2, the argocd-cm library
# set) once per machine. The binary lands in ~/.cache/mtrl/luacheck-<hash of its sources>/, so an
# edit to the harness or a new pin builds a new one. Prints the binary's path on its last line.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/luacheck" && pwd)"
KEY=$(cd "${SRC}" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
BIN="${HOME}/.cache/mtrl/luacheck-${KEY}/luacheck"
if [ ! -x "${BIN}" ]; then
  command -v go >/dev/null || { echo "go toolchain not found; install Go >= 1.24" >&2; exit 1; }
  mkdir -p "$(dirname "${BIN}")"
  # A private temporary name, then a rename: concurrent builds never see half a binary.
  tmp=$(mktemp "${BIN}.XXXXXX")
  (cd "${SRC}" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "${tmp}" .)
  chmod 0755 "${tmp}" && mv "${tmp}" "${BIN}"
fi
echo "${BIN}"
