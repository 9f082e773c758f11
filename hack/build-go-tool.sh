#!/usr/bin/env bash
# Builds one of the Go test tools under hack/ (hack/<name>: a main package with its own go.mod)
# once per machine. The binary lands in ~/.cache/mtrl/<name>-<hash of its sources>/, so an edit
# to the tool or a new pin builds a new one. Prints the binary's path on its last line.
set -euo pipefail
NAME="$1"
SRC="$(cd "$(dirname "$0")/${NAME}" && pwd)"
KEY=$(cd "${SRC}" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
BIN="${HOME}/.cache/mtrl/${NAME}-${KEY}/${NAME}"
if [ ! -x "${BIN}" ]; then
  GO_VERSION=$(awk '$1 == "go" {print $2}' "${SRC}/go.mod")
  command -v go >/dev/null || { echo "go toolchain not found; install Go >= ${GO_VERSION}" >&2; exit 1; }
  mkdir -p "$(dirname "${BIN}")"
  # A private temporary name, then a rename: concurrent builds never see half a binary.
  tmp=$(mktemp "${BIN}.XXXXXX")
  (cd "${SRC}" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "${tmp}" .)
  chmod 0755 "${tmp}" && mv "${tmp}" "${BIN}"
fi
echo "${BIN}"
