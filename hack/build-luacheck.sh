#!/usr/bin/env bash
# Builds hack/luacheck (Argo CD's health-check runtime: gopher-lua v1.1.2, the argocd-cm library
# set) once per machine; prints the binary's path on its last line.
exec bash "$(dirname "$0")/build-go-tool.sh" luacheck
