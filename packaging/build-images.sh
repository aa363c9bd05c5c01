#!/usr/bin/env bash
# Build the bootc-fleet-coordinator and bootc-fleet-agent images with buildah or
# podman (whichever is installed; BUILDER= picks one) and write each as an OCI
# archive:
#
#   OUT/bootc-fleet-coordinator-linux-ARCH     static binaries (CGO_ENABLED=0)
#   OUT/bootc-fleet-agent-linux-ARCH
#   OUT/bootc-fleet-coordinator-VERSION-linux-ARCH.oci.tar
#   OUT/bootc-fleet-agent-VERSION-linux-ARCH.oci.tar
#
# Usage: build-images.sh --version VERSION --out DIR [--arch ARCH]...
#   (default arch: the build host's). Environment: BUILDER (buildah|podman),
#   BUILDER_OPTS (global options, e.g. "--storage-driver vfs"), IMAGE_REPO
#   (default quay.io/bootc-fleet), CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt).
#
# The images are FROM scratch and have no RUN step, so any architecture builds
# on any host without emulation. Each image is tagged IMAGE_REPO/NAME:VERSION in
# the builder's storage (VERSION-ARCH for a second architecture) and carries
# the OCI labels source, revision, version, title and description.
set -euo pipefail

die() { echo "build-images.sh: $*" >&2; exit 1; }
src=$(cd "$(dirname "$0")/.." && pwd)
version="" out="" arches=()
while [[ $# -gt 0 ]]; do
	case "$1" in
	--version) version=${2:?}; shift 2 ;;
	--out) out=${2:?}; shift 2 ;;
	--arch) arches+=("${2:?}"); shift 2 ;;
	*) die "unknown argument $1 (usage: build-images.sh --version VERSION --out DIR [--arch ARCH]...)" ;;
	esac
done
[[ -n "$version" && -n "$out" ]] || die "usage: build-images.sh --version VERSION --out DIR [--arch ARCH]..."
[[ "$version" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "version $version is not a valid image tag"
[[ ${#arches[@]} -gt 0 ]] || arches=("$(go env GOARCH)")

builder=${BUILDER:-}
if [[ -z "$builder" ]]; then
	for b in buildah podman; do
		if command -v "$b" >/dev/null; then builder=$b; break; fi
	done
fi
[[ -n "$builder" ]] || die "neither buildah nor podman is installed (Debian: apt-get install buildah)"
read -r -a opts <<<"${BUILDER_OPTS:-}"
repo=${IMAGE_REPO:-quay.io/bootc-fleet}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -s "$ca" ]] || die "CA bundle $ca is missing (Debian: apt-get install ca-certificates)"

cd "$src"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit time stamps the images and their files, so a rebuild of the same
# commit gives the same layers.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
source_url=https://github.com/bootc-fleet/bootc-fleet

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() { # name arch context containerfile title description
	local name=$1 arch=$2 ctx=$3 cf=$4 title=$5 desc=$6 tag
	tag="$repo/$name:$version"
	[[ "$arch" == "${arches[0]}" ]] || tag="$tag-$arch"
	"$builder" "${opts[@]}" build --quiet --platform "linux/$arch" --timestamp "$epoch" \
		--label "org.opencontainers.image.source=$source_url" \
		--label "org.opencontainers.image.revision=$revision" \
		--label "org.opencontainers.image.version=$version" \
		--label "org.opencontainers.image.title=$title" \
		--label "org.opencontainers.image.description=$desc" \
		-f "$cf" -t "$tag" "$ctx" >/dev/null
	rm -f "$out/$name-$version-linux-$arch.oci.tar"
	"$builder" "${opts[@]}" push --quiet "$tag" "oci-archive:$out/$name-$version-linux-$arch.oci.tar:$repo/$name:$version"
	echo "$tag -> $out/$name-$version-linux-$arch.oci.tar"
}

for arch in "${arches[@]}"; do
	for prog in agent coordinator; do
		CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$version" \
			-o "$out/bootc-fleet-$prog-linux-$arch" "./cmd/bootc-fleet-$prog"
	done

	c="$work/coordinator-$arch"
	mkdir -p "$c"
	cp "$out/bootc-fleet-coordinator-linux-$arch" "$c/bootc-fleet-coordinator"
	cp "$ca" "$c/ca-certificates.crt"
	printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$c/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$c/group"
	build bootc-fleet-coordinator "$arch" "$c" packaging/coordinator/Containerfile \
		bootc-fleet-coordinator "bootc-fleet coordinator: rolls bootc OS images across a Kubernetes fleet"

	a="$work/agent-$arch"
	mkdir -p "$a"
	cp "$out/bootc-fleet-agent-linux-$arch" "$a/bootc-fleet-agent"
	cp -r units "$a/units"
	cp packaging/image/install.sh "$a/install.sh"
	build bootc-fleet-agent "$arch" "$a" packaging/image/agent.Containerfile \
		bootc-fleet-agent "bootc-fleet agent and its installer, mounted by a bootc image build (docs/image.md)"
done
