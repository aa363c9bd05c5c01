#!/usr/bin/env bash
# Build a release into OUT (`make release VERSION=vX.Y.Z` runs it):
#
#   bootc-fleet-{agent,coordinator}-linux-{amd64,arm64}        static binaries
#   bootc-fleet-{agent,coordinator}-VERSION-linux-ARCH.oci.tar  the images
#   kubectl-bootc_fleet-linux-{amd64,arm64}                     the kubectl plugin
#   kubectl-bootc_fleet-VERSION-linux-ARCH.tar.gz, bootc-fleet.yaml  its krew archives and manifest (krew.sh)
#   bootc-fleet-VERSION.yaml    `kubectl kustomize packaging/`, image pinned to VERSION
#   bootc-fleet-X.Y.Z.tgz       the Helm chart (`helm package`), appVersion VERSION
#   SHA256SUMS                  of all of the above
#
# Environment: VERSION, KUBECTL, HELM (paths), and what build-images.sh and
# krew.sh read.
set -euo pipefail
die() { echo "release.sh: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: release.sh OUT"
: "${VERSION:?}" "${KUBECTL:?}" "${HELM:?}"
src=$(cd "$(dirname "$0")/.." && pwd)
out=$1
[[ -x "$KUBECTL" ]] || die "kubectl $KUBECTL is missing"
[[ -x "$HELM" ]] || die "helm $HELM is missing"
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$src"

bash packaging/build-images.sh --version "$VERSION" --out "$out" --arch amd64 --arch arm64

# The kubectl plugin, static, for the same architectures.
for arch in amd64 arm64; do
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$VERSION" \
		-o "$out/kubectl-bootc_fleet-linux-$arch" ./cmd/kubectl-bootc_fleet
done

# Every binary prints the release (those of this host's architecture run here).
host=$(go env GOARCH)
for prog in agent coordinator; do
	got=$("$out/bootc-fleet-$prog-linux-$host" --version)
	[[ "$got" == "bootc-fleet-$prog $VERSION" ]] || die "bootc-fleet-$prog --version printed '$got', want 'bootc-fleet-$prog $VERSION'"
done
got=$("$out/kubectl-bootc_fleet-linux-$host" --version)
[[ "$got" == *"$VERSION"* ]] || die "kubectl-bootc_fleet --version printed '$got', want it to name $VERSION"
bash packaging/krew.sh "$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r packaging "$tmp/packaging"
sed -i -E "s|^(    newTag:).*|\1 $VERSION|" "$tmp/packaging/kustomization.yaml"
grep -q "newTag: $VERSION\$" "$tmp/packaging/kustomization.yaml" || die "could not pin the kustomization to $VERSION"
"$KUBECTL" kustomize "$tmp/packaging" >"$out/bootc-fleet-$VERSION.yaml"

"$HELM" lint packaging/chart >/dev/null
"$HELM" package packaging/chart --version "${VERSION#v}" --app-version "$VERSION" -d "$out" >/dev/null

for f in packaging/kustomization.yaml packaging/chart/Chart.yaml docs/image.md; do
	grep -q "$VERSION" "$f" || echo "release.sh: note: $f does not name $VERSION; pin it (see CHANGELOG.md) and commit" >&2
done

(cd "$out" && sha256sum -- * >SHA256SUMS)
echo "release $VERSION in $out:"
(cd "$out" && ls -l)
