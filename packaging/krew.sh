#!/usr/bin/env bash
# Package the kubectl plugin for krew (release.sh runs it): from the plugin
# binaries OUT/kubectl-bootc_fleet-linux-{amd64,arm64} it writes
#
#   kubectl-bootc_fleet-VERSION-linux-ARCH.tar.gz   the binary as kubectl-bootc_fleet
#   bootc-fleet.yaml   the krew plugin manifest: each archive's URI and SHA-256
#
# The archives are reproducible (sorted, owner 0, mtime of the commit, gzip -n).
# Environment: VERSION; RELEASE_URL, where the archives are published
# (default: the GitHub release of VERSION).
set -euo pipefail
die() { echo "krew.sh: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: krew.sh OUT"
: "${VERSION:?}"
out=$(cd "$1" && pwd)
url=${RELEASE_URL:-https://github.com/bootc-fleet/bootc-fleet/releases/download/$VERSION}
src=$(cd "$(dirname "$0")/.." && pwd)
mtime=$(git -C "$src" log -1 --format=%ct 2>/dev/null || echo 0)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
platforms=""
for arch in amd64 arm64; do
	bin="$out/kubectl-bootc_fleet-linux-$arch"
	[[ -x "$bin" ]] || die "$bin is missing"
	archive="kubectl-bootc_fleet-$VERSION-linux-$arch.tar.gz"
	mkdir -p "$tmp/$arch"
	install -m 0755 "$bin" "$tmp/$arch/kubectl-bootc_fleet"
	tar -C "$tmp/$arch" --sort=name --mtime="@$mtime" --owner=0 --group=0 --numeric-owner \
		-cf - kubectl-bootc_fleet | gzip -n -9 >"$out/$archive"
	sum=$(sha256sum "$out/$archive" | cut -d' ' -f1)
	platforms+="  - selector:
      matchLabels:
        os: linux
        arch: $arch
    uri: $url/$archive
    sha256: $sum
    bin: kubectl-bootc_fleet
"
done

cat >"$out/bootc-fleet.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: bootc-fleet
spec:
  version: $VERSION
  homepage: https://github.com/bootc-fleet/bootc-fleet
  shortDescription: See, wait for and steer bootc OS image rollouts
  description: |
    Shows how far each bootc-fleet BootcNodePool's OS image rollout is, what
    blocks it and why each node waits (status, status --watch, explain); waits
    for a pool to be up to date (wait); pauses and resumes pools and holds
    nodes out of rollouts (pause, resume, hold, release).
  caveats: |
    The cluster needs bootc-fleet (its CRDs and coordinator). The plugin reads
    BootcNodePools, BootcNodes, Nodes and the slot Leases in
    bootc-fleet-system; docs/kubectl.md lists the RBAC each command needs.
  platforms:
$platforms
YAML
# No trailing blank line.
sed -i -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$out/bootc-fleet.yaml"
