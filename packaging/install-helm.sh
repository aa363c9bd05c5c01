#!/usr/bin/env bash
# Build helm once from the Go module proxy into DIR (default
# ~/.cache/bootc-fleet/helm/HELM_VERSION) and print the path of the binary.
# `make chart-package`, `make release` and tests/packaging use it.
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.22.0}
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/bootc-fleet/helm/$HELM_VERSION}
if [[ -x "$dir/helm" ]]; then
	echo "$dir/helm"
	exit 0
fi
mkdir -p "$dir"
echo "building helm $HELM_VERSION into $dir (once, ~3 min)" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Outside this module, so helm's dependencies do not touch go.mod.
(cd "$tmp" && GOFLAGS=-trimpath GOBIN="$tmp" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") >&2
mv "$tmp/helm" "$dir/helm"
echo "$dir/helm"
