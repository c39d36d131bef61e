#!/usr/bin/env bash
# Builds the binaries that the end-to-end tests run against: kube-apiserver,
# kubectl and etcd, from the versions pinned in tools/go.mod; and for the
# node (root on Linux only) kubelet, kube-controller-manager, kube-scheduler,
# kube-proxy, kubeadm (whose CoreDNS addon phase the lifecycle test runs)
# from tools/go.mod and containerd, its runc shim and ctr from
# tools/containerd/go.mod, plus Debian's runc, CNI plugins, iptables and
# conntrack; Prometheus with promtool, from Debian's package, for the
# alerting rules' tests; and an OpenTelemetry Collector from
# tools/otelcol/go.mod for the event-routing recipe's test; for the node,
# the stock CoreDNS its lifecycle test starts from, from that release's
# own module (tools/coredns/go.mod); and helm from tools/helm/go.mod,
# which renders the helm values' test data. Each binary is
# cached outside the repository in $K8S_EVENT_CACHE/<name>-<version>/ and
# built only when missing. A build goes to a temporary directory that is
# renamed into place, so concurrent runs never see a half-written binary.
#
# Usage:
#   hack/tools.sh install        build whatever is missing (the default)
#   hack/tools.sh node           install, plus what the node needs
#   hack/tools.sh env [node]     install (node: plus the node), then print
#                                KUBE_APISERVER=, ETCD=, KUBECTL=, the node's
#                                binaries when they are there, OTELCOL=,
#                                PROMETHEUS=
#                                and PROMTOOL= when apt-get could fetch
#                                them, and DNSPERF= when installed
#   hack/tools.sh demo-env [node]
#                                as env, but only what `make demo` runs:
#                                KUBE_APISERVER=, ETCD=, KUBECTL= (node: and
#                                the node's binaries but kubeadm); no
#                                collector, Prometheus or kubeadm
#   hack/tools.sh dnsperf        install Debian's dnsperf when it is missing
#   hack/tools.sh helm           build helm, then print its path
#   hack/tools.sh krew           build krew and its validate-krew-manifest
#                                from tools/krew/go.mod, then print KREW= and
#                                VALIDATE_KREW_MANIFEST=
#   hack/tools.sh clean          remove the cache
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_mod="$root/tools"
cache="${K8S_EVENT_CACHE:-$HOME/.cache/k8s_event}"

log() { echo "tools.sh: $*" >&2; }

module_version() {
	(cd "${2:-$tools_mod}" && go list -m -f '{{.Version}}' "$1")
}

# build NAME VERSION PACKAGE [LDFLAGS [MODULE_DIR]] prints the path of NAME,
# building it into $cache/NAME-VERSION/ first when it is not there.
build() {
	local name=$1 version=$2 pkg=$3 ldflags=${4:-} mod=${5:-$tools_mod}
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
	if ! (cd "$mod" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
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

# install_control_plane builds kube-apiserver, kubectl and etcd.
install_control_plane() {
	command -v go >/dev/null || { log "go is not on PATH"; return 1; }
	local kube etcd
	kube=$(module_version k8s.io/kubernetes)
	etcd=$(module_version go.etcd.io/etcd/server/v3)
	KUBE_APISERVER=$(build kube-apiserver "$kube" k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags "$kube")")
	KUBECTL=$(build kubectl "$kube" k8s.io/kubernetes/cmd/kubectl "$(kube_ldflags "$kube")")
	ETCD=$(build etcd "$etcd" go.etcd.io/etcd/server/v3)
}

install() {
	install_control_plane
	local otel
	otel=$(module_version go.opentelemetry.io/collector/otelcol "$tools_mod/otelcol")
	OTELCOL=$(build otelcol "$otel" . "" "$tools_mod/otelcol")
	install_prometheus
}

# apt_install PACKAGE... installs Debian packages, updating the package
# lists once when the first attempt fails.
apt_install() {
	local sudo=""
	[[ $(id -u) == 0 ]] || sudo=sudo
	log "installing $* with apt-get"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 ||
		{ $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2; }
}

install_dnsperf() {
	command -v dnsperf >/dev/null && return
	apt_install dnsperf
}

# prometheus_deb is the version of Debian's prometheus package whose
# prometheus and promtool the alerting rules are tested with.
prometheus_deb=2.42.0+ds-5+deb12u1

# install_prometheus unpacks Debian's prometheus package into the cache,
# without installing it: no service is started, nothing outside the cache
# changes. Without apt-get it says so and leaves PROMETHEUS unset.
install_prometheus() {
	local dir="$cache/prometheus-$prometheus_deb"
	if [[ ! -x "$dir/promtool" ]]; then
		if ! command -v apt-get >/dev/null; then
			log "no apt-get: Prometheus is not installed and the alerting rules' test skips"
			return
		fi
		mkdir -p "$cache"
		local tmp
		tmp=$(mktemp -d "$cache/.prometheus-$prometheus_deb.XXXXXX")
		chmod 755 "$tmp"
		log "fetching Debian's prometheus $prometheus_deb"
		# The pinned version, or, once the archive has replaced it, the
		# one it has now (said out loud; the rules' tests hold for both).
		if ! (cd "$tmp" && { apt-get download -q "prometheus=$prometheus_deb" >&2 ||
			{ apt-get update -q >&2 && apt-get download -q "prometheus=$prometheus_deb" >&2; } ||
			{ log "prometheus $prometheus_deb is gone from the archive: taking $(apt-cache policy prometheus | awk '/Candidate/ {print $2}')" &&
				apt-get download -q prometheus >&2; }; } &&
			dpkg-deb -x prometheus_*.deb pkg && mv pkg/usr/bin/prometheus pkg/usr/bin/promtool . &&
			rm -rf pkg prometheus_*.deb); then
			rm -rf "$tmp"
			log "fetching prometheus $prometheus_deb failed"
			return 1
		fi
		mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
	fi
	PROMETHEUS="$dir/prometheus"
	PROMTOOL="$dir/promtool"
}

containerd_mod="$tools_mod/containerd"

# install_node installs what the node needs; with "nokubeadm", all but
# kubeadm, which only the lifecycle test runs.
install_node() {
	local missing=()
	command -v runc >/dev/null || missing+=(runc)
	[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
	command -v iptables >/dev/null || missing+=(iptables)
	command -v conntrack >/dev/null || missing+=(conntrack)
	if ((${#missing[@]})); then apt_install "${missing[@]}"; fi
	local kube ctrd
	kube=$(module_version k8s.io/kubernetes)
	KUBELET=$(build kubelet "$kube" k8s.io/kubernetes/cmd/kubelet "$(kube_ldflags "$kube")")
	KUBE_CONTROLLER_MANAGER=$(build kube-controller-manager "$kube" k8s.io/kubernetes/cmd/kube-controller-manager "$(kube_ldflags "$kube")")
	KUBE_SCHEDULER=$(build kube-scheduler "$kube" k8s.io/kubernetes/cmd/kube-scheduler "$(kube_ldflags "$kube")")
	KUBE_PROXY=$(build kube-proxy "$kube" k8s.io/kubernetes/cmd/kube-proxy "$(kube_ldflags "$kube")")
	[[ ${1:-} == nokubeadm ]] || KUBEADM=$(build kubeadm "$kube" k8s.io/kubernetes/cmd/kubeadm "$(kube_ldflags "$kube")")
	ctrd=$(module_version github.com/containerd/containerd/v2 "$containerd_mod")
	local vflag="-X github.com/containerd/containerd/v2/version.Version=${ctrd#v}"
	CONTAINERD=$(build containerd "$ctrd" github.com/containerd/containerd/v2/cmd/containerd "$vflag" "$containerd_mod")
	CONTAINERD_SHIM=$(build containerd-shim-runc-v2 "$ctrd" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$vflag" "$containerd_mod")
	CTR=$(build ctr "$ctrd" github.com/containerd/containerd/v2/cmd/ctr "$vflag" "$containerd_mod")
	local stock
	stock=$(module_version github.com/coredns/coredns "$tools_mod/coredns")
	COREDNS_STOCK=$(build coredns-stock "$stock" github.com/coredns/coredns "" "$tools_mod/coredns")
}

install_helm() {
	local v
	v=$(module_version helm.sh/helm/v3 "$tools_mod/helm")
	build helm "$v" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$v" "$tools_mod/helm"
}

# install_krew builds krew and validate-krew-manifest, which check the
# kubectl plugin's krew manifest and archives (krew keeps its validation in
# an internal package: its own command is the way in).
install_krew() {
	local v mod="$tools_mod/krew"
	v=$(module_version sigs.k8s.io/krew "$mod")
	local vflags="-X sigs.k8s.io/krew/internal/version.gitTag=$v"
	KREW=$(build krew "$v" sigs.k8s.io/krew/cmd/krew "$vflags" "$mod")
	VALIDATE_KREW_MANIFEST=$(build validate-krew-manifest "$v" sigs.k8s.io/krew/cmd/validate-krew-manifest "$vflags" "$mod")
	printf "KREW=%q\nVALIDATE_KREW_MANIFEST=%q\n" "$KREW" "$VALIDATE_KREW_MANIFEST"
}

print_env() {
	printf "KUBE_APISERVER=%q\nETCD=%q\nKUBECTL=%q\n" "$KUBE_APISERVER" "$ETCD" "$KUBECTL"
	if [[ -n ${OTELCOL:-} ]]; then printf "OTELCOL=%q\n" "$OTELCOL"; fi
	if [[ -n ${KUBELET:-} ]]; then
		printf "KUBELET=%q\nKUBE_CONTROLLER_MANAGER=%q\nKUBE_SCHEDULER=%q\nKUBE_PROXY=%q\n" "$KUBELET" "$KUBE_CONTROLLER_MANAGER" "$KUBE_SCHEDULER" "$KUBE_PROXY"
		if [[ -n ${KUBEADM:-} ]]; then printf "KUBEADM=%q\n" "$KUBEADM"; fi
		printf "CONTAINERD=%q\nCONTAINERD_SHIM=%q\nCTR=%q\n" "$CONTAINERD" "$CONTAINERD_SHIM" "$CTR"
		if [[ -n ${COREDNS_STOCK:-} ]]; then printf "COREDNS_STOCK=%q\n" "$COREDNS_STOCK"; fi
	fi
	if [[ -n ${PROMETHEUS:-} ]]; then printf "PROMETHEUS=%q\nPROMTOOL=%q\n" "$PROMETHEUS" "$PROMTOOL"; fi
	if command -v dnsperf >/dev/null; then printf "DNSPERF=%q\n" "$(command -v dnsperf)"; fi
}

case "${1:-install}" in
install)
	install
	;;
node)
	install
	install_node
	;;
env)
	install
	if [[ ${2:-} == node ]]; then install_node; fi
	print_env
	;;
demo-env)
	install_control_plane
	if [[ ${2:-} == node ]]; then install_node nokubeadm; fi
	print_env
	;;
dnsperf)
	install_dnsperf
	;;
helm)
	install_helm
	;;
krew)
	install_krew
	;;
clean)
	rm -rf "$cache"
	;;
*)
	echo "usage: $0 [install|node|env [node]|demo-env [node]|dnsperf|helm|krew|clean]" >&2
	exit 2
	;;
esac
