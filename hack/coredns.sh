#!/usr/bin/env bash
# CoreDNS releases that k8s_event builds on. The plugin's go.mod requires
# the oldest CoreDNS it supports (its floor); cmd/coredns, a module of its
# own, requires the release the image ships by default (the newest). Any
# release from the floor up builds through a go.mod made for it: CoreDNS
# at that release with its own requirements, plus kubeapi and k8s_event,
# tidied, so that only what k8s_event itself requires is raised. Each is
# made once and cached outside the repository in
# $K8S_EVENT_CACHE/coredns-mod/<version>-<hash of the go.mod files>/
# (go.mod and go.sum), rebuilt from nothing when missing.
#
# Usage:
#   hack/coredns.sh default          the CoreDNS version cmd/coredns requires
#   hack/coredns.sh floor            the CoreDNS version the plugin requires
#   hack/coredns.sh consumer         check that a CoreDNS tree at the floor
#                                    builds with k8s_event and keeps its
#                                    CoreDNS and client-go versions
#   hack/coredns.sh modfile VERSION  the -modfile flag for `go build` in
#                                    cmd/coredns that builds on CoreDNS
#                                    VERSION (1.13.1 or v1.13.1); nothing
#                                    for the default version
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache="${K8S_EVENT_CACHE:-$HOME/.cache/k8s_event}"
cmd="$root/cmd/coredns"

log() { echo "coredns.sh: $*" >&2; }

version_in() { (cd "$1" && go list -m -f '{{.Version}}' "${2:-github.com/coredns/coredns}"); }

modfile() {
	local v=v${1#v}
	if [[ $v == "$(version_in "$cmd")" ]]; then
		return
	fi
	local floor
	floor=$(version_in "$root")
	if [[ $(printf '%s\n%s\n' "$floor" "$v" | sort -V | head -1) != "$floor" ]]; then
		log "CoreDNS $v is older than k8s_event's floor $floor (the CoreDNS its go.mod requires)"
		return 1
	fi
	local hash dir
	hash=$(cat "$root/go.mod" "$cmd/go.mod" | sha256sum | cut -c1-12)
	dir="$cache/coredns-mod/$v-$hash"
	if [[ ! -f $dir/go.sum ]]; then
		mkdir -p "$cache/coredns-mod"
		local tmp kubeapi
		tmp=$(mktemp -d "$cache/coredns-mod/.$v.XXXXXX")
		kubeapi=$(version_in "$cmd" github.com/coredns/kubeapi)
		# The replace path is relative to cmd/coredns, the module's root,
		# wherever the go.mod given to -modfile lies.
		cat >"$tmp/go.mod" <<-EOF
			module github.com/dnsops/k8s_event/cmd/coredns

			go $(sed -n 's/^go //p' "$cmd/go.mod")

			require (
			github.com/coredns/coredns $v
			github.com/coredns/kubeapi $kubeapi
			github.com/dnsops/k8s_event v0.0.0-00010101000000-000000000000
			)

			replace github.com/dnsops/k8s_event => ../..
		EOF
		log "making the module of cmd/coredns on CoreDNS $v"
		if ! (cd "$cmd" && go mod tidy -modfile="$tmp/go.mod" >&2); then
			rm -rf "$tmp"
			log "no module of cmd/coredns on CoreDNS $v"
			return 1
		fi
		local got
		got=$(cd "$cmd" && go list -modfile="$tmp/go.mod" -m -f '{{.Version}}' github.com/coredns/coredns)
		if [[ $got != "$v" ]]; then
			rm -rf "$tmp"
			log "asked for CoreDNS $v, the requirements select $got"
			return 1
		fi
		mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
	fi
	echo "-modfile=$dir/go.mod"
}

# consumer checks the floor as a CoreDNS tree sees it: a module that
# requires CoreDNS at the floor and blank-imports every in-tree plugin,
# kubeapi and k8s_event (as plugin.cfg does) builds, and k8s_event raises
# none of the versions CoreDNS alone selects of CoreDNS, client-go,
# apimachinery and api. Whatever else it raises, and its go line, are
# printed.
consumer() {
	local floor tmp
	floor=$(version_in "$root")
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	local gomod
	gomod=$(cd "$root" && go mod download -json "github.com/coredns/coredns@$floor" | sed -n 's/.*"GoMod": "\(.*\)",*$/\1/p')
	local goline
	goline=$(sed -n 's/^go //p' "$gomod")
	mkdir -p "$tmp/alone" "$tmp/tree"
	cat >"$tmp/alone/go.mod" <<-EOF
		module example.com/coredns

		go $goline

		require github.com/coredns/coredns $floor
	EOF
	cat >"$tmp/alone/main.go" <<-EOF
		package main

		import (
		_ "github.com/coredns/coredns/core/plugin"
		"github.com/coredns/coredns/coremain"
		)

		func main() { coremain.Run() }
	EOF
	cp "$tmp/alone/go.mod" "$tmp/tree/go.mod"
	cat >>"$tmp/tree/go.mod" <<-EOF

		require github.com/dnsops/k8s_event v0.0.0-00010101000000-000000000000

		replace github.com/dnsops/k8s_event => $root
	EOF
	cat >"$tmp/tree/main.go" <<-EOF
		package main

		import (
		_ "github.com/coredns/coredns/core/plugin"
		"github.com/coredns/coredns/coremain"
		_ "github.com/coredns/kubeapi"
		_ "github.com/dnsops/k8s_event"
		)

		func main() { coremain.Run() }
	EOF
	(cd "$tmp/alone" && go mod tidy >&2 && go list -m -f '{{.Path}} {{.Version}}' all) | sort >"$tmp/alone.txt"
	(cd "$tmp/tree" && go mod tidy >&2 && go list -m -f '{{.Path}} {{.Version}}' all) | sort >"$tmp/tree.txt"
	local raised=0 path want got
	echo "CoreDNS $floor (go $goline) with kubeapi and k8s_event: go $(sed -n 's/^go //p' "$tmp/tree/go.mod")"
	while read -r path want; do
		got=$(awk -v p="$path" '$1 == p {print $2}' "$tmp/tree.txt")
		[[ -n $got && $got != "$want" ]] || continue
		echo "  raises $path $want -> $got"
		case $path in
		github.com/coredns/coredns | k8s.io/client-go | k8s.io/apimachinery | k8s.io/api) raised=1 ;;
		esac
	done <"$tmp/alone.txt"
	if ((raised)); then
		log "k8s_event raises CoreDNS's own requirements at its floor $floor"
		return 1
	fi
	(cd "$tmp/tree" && CGO_ENABLED=0 go build -o "$tmp/coredns" . && "$tmp/coredns" -plugins | grep -qx k8s_event)
	echo "  builds, with k8s_event"
}

case "${1:-}" in
default)
	version_in "$cmd"
	;;
floor)
	version_in "$root"
	;;
consumer)
	consumer
	;;
modfile)
	[[ -n ${2:-} ]] || {
		echo "usage: $0 modfile VERSION" >&2
		exit 2
	}
	modfile "$2"
	;;
*)
	echo "usage: $0 default|floor|consumer|modfile VERSION" >&2
	exit 2
	;;
esac
