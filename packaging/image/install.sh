#!/bin/sh
# Install bootc-fleet-agent into a root filesystem: the binary, its systemd
# unit, preset and default environment; enable the unit; mask
# bootc-fetch-apply-updates.timer, which would apply updates on its own.
#
# Usage: install.sh [--agent FILE] [--units DIR] ROOT
#
# The image build (packaging/image/Containerfile) runs it with ROOT=/; the
# end-to-end tests (tests/e2e) run it on the root filesystem their nodes boot,
# so both get exactly the same files. Running it twice changes nothing.
set -eu

usage() {
	echo "usage: $0 [--agent FILE] [--units DIR] ROOT" >&2
	echo "  --agent FILE  the bootc-fleet-agent binary (default: bin/bootc-fleet-agent of this source tree)" >&2
	echo "  --units DIR   the units/ folder (default: units/ of this source tree)" >&2
	exit 2
}
die() { echo "install.sh: $*" >&2; exit 1; }

src=$(cd "$(dirname "$0")/../.." && pwd)
agent="$src/bin/bootc-fleet-agent"
units="$src/units"
root=""
while [ $# -gt 0 ]; do
	case "$1" in
	--agent) [ $# -ge 2 ] || usage; agent=$2; shift 2 ;;
	--units) [ $# -ge 2 ] || usage; units=$2; shift 2 ;;
	-h|--help) usage ;;
	--) shift; break ;;
	-*) echo "install.sh: unknown option $1" >&2; usage ;;
	*) [ -z "$root" ] || usage; root=$1; shift ;;
	esac
done
if [ $# -gt 0 ]; then
	[ -z "$root" ] && [ $# -eq 1 ] || usage
	root=$1
fi
[ -n "$root" ] || usage

case "$root" in
/*) ;;
*) die "ROOT must be an absolute path, got '$root'" ;;
esac
[ -d "$root" ] || die "ROOT $root is not a directory"
[ -f "$agent" ] && [ -x "$agent" ] || die "agent binary $agent is missing or not executable (run 'make build' or pass --agent)"
service="$units/bootc-fleet-agent.service"
preset="$units/90-bootc-fleet.preset"
envfile="$units/agent.env"
for f in "$service" "$preset" "$envfile"; do
	[ -f "$f" ] || die "$f is missing"
done

# Everything goes below ROOT; "/" must not become "//usr".
r=${root%/}

install -D -m 0755 "$agent" "$r/usr/bin/bootc-fleet-agent"
for u in "$units"/*.service "$units"/*.timer "$units"/*.socket "$units"/*.target; do
	[ -f "$u" ] || continue
	install -D -m 0644 "$u" "$r/usr/lib/systemd/system/$(basename "$u")"
done
install -D -m 0644 "$preset" "$r/usr/lib/systemd/system-preset/$(basename "$preset")"
install -D -m 0644 "$envfile" "$r/usr/lib/bootc-fleet/agent.env"
# Site configuration (/etc/bootc-fleet/agent.env) is the administrator's:
# create the directory, never the file.
install -d -m 0755 "$r/etc/bootc-fleet"

# Enable: what `systemctl enable` does, from the unit's own [Install]
# section, without needing a running (or any) systemctl in the build.
wanted=$(sed -n 's/^[[:space:]]*WantedBy[[:space:]]*=[[:space:]]*//p' "$service" | tr ' ' '\n' | sed '/^$/d')
[ -n "$wanted" ] || die "$service has no WantedBy= in [Install]"
for t in $wanted; do
	case "$t" in
	*[!A-Za-z0-9@._-]*) die "unexpected WantedBy=$t in $service" ;;
	esac
	install -d -m 0755 "$r/etc/systemd/system/$t.wants"
	ln -sfn /usr/lib/systemd/system/bootc-fleet-agent.service "$r/etc/systemd/system/$t.wants/bootc-fleet-agent.service"
done

# bootc's own updater would stage and apply updates outside any grant: mask
# the timer and the service it starts (anything else starting the service
# would run `bootc upgrade --apply`).
install -d -m 0755 "$r/etc/systemd/system"
for u in bootc-fetch-apply-updates.timer bootc-fetch-apply-updates.service; do
	ln -sfn /dev/null "$r/etc/systemd/system/$u"
done
