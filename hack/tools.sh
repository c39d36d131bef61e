#!/usr/bin/env bash
# Builds the binaries that the end-to-end tests run against: kube-apiserver,
# kubectl and etcd, from the versions pinned in tools/go.mod. Each binary is
# cached outside the repository in $K8S_EVENT_CACHE/<name>-<version>/ and
# built only when missing. A build goes to a temporary directory that is
# renamed into place, so concurrent runs never see a half-written binary.
#
# Usage:
#   hack/tools.sh install   build whatever is missing (the default)
#   hack/tools.sh env       install, then print KUBE_APISERVER=, ETCD=,
#                           KUBECTL= (and DNSPERF= when installed)
#   hack/tools.sh dnsperf   install Debian's dnsperf when it is missing
#   hack/tools.sh clean     remove the cache
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_mod="$root/tools"
cache="${K8S_EVENT_CACHE:-$HOME/.cache/k8s_event}"

log() { echo "tools.sh: $*" >&2; }

module_version() {
	(cd "$tools_mod" && go list -m -f '{{.Version}}' "$1")
}

# build NAME VERSION PACKAGE [LDFLAGS] prints the path of NAME, building it
# into $cache/NAME-VERSION/ first when it is not there.
build() {
	local name=$1 version=$2 pkg=$3 ldflags=${4:-}
	local dir="$cache/$name-$version"
	if [[ -x "$dir/$name" ]]; then
		echo "$dir/$name"
		return
	fi
	mkdir -p "$cache"
	local tmp
	tmp=$(mktemp -d "$cache/.$name-$version.XXXXXX")
	chmod 755 "$tmp"
	log "building $name $version (this takes a few minutes the first time)"
	local start=$SECONDS
	if ! (cd "$tools_mod" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
		-ldflags "-s -w $ldflags" -o "$tmp/$name" "$pkg"); then
		rm -rf "$tmp"
		log "building $name failed"
		return 1
	fi
	# rename(2) onto a non-empty directory fails: when another run got
	# there first, keep its binary and drop ours.
	if ! mv -T "$tmp" "$dir" 2>/dev/null; then
		rm -rf "$tmp"
	fi
	log "built $dir/$name in $((SECONDS - start))s"
	echo "$dir/$name"
}

kube_ldflags() {
	local v=$1 minor
	minor=$(echo "$v" | cut -d. -f2)
	local flags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean"
	done
	echo "$flags"
}

install() {
	command -v go >/dev/null || { log "go is not on PATH"; return 1; }
	local kube etcd
	kube=$(module_version k8s.io/kubernetes)
	etcd=$(module_version go.etcd.io/etcd/server/v3)
	KUBE_APISERVER=$(build kube-apiserver "$kube" k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags "$kube")")
	KUBECTL=$(build kubectl "$kube" k8s.io/kubernetes/cmd/kubectl "$(kube_ldflags "$kube")")
	ETCD=$(build etcd "$etcd" go.etcd.io/etcd/server/v3)
}

install_dnsperf() {
	command -v dnsperf >/dev/null && return
	local sudo=""
	[[ $(id -u) == 0 ]] || sudo=sudo
	log "installing dnsperf with apt-get"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsperf >&2 ||
		{ $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsperf >&2; }
}

case "${1:-install}" in
install)
	install
	;;
env)
	install
	printf "KUBE_APISERVER=%q\nETCD=%q\nKUBECTL=%q\n" "$KUBE_APISERVER" "$ETCD" "$KUBECTL"
	if command -v dnsperf >/dev/null; then printf "DNSPERF=%q\n" "$(command -v dnsperf)"; fi
	;;
dnsperf)
	install_dnsperf
	;;
clean)
	rm -rf "$cache"
	;;
*)
	echo "usage: $0 [install|env|dnsperf|clean]" >&2
	exit 2
	;;
esac
