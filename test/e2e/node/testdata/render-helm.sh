#!/usr/bin/env bash
# Renders the official CoreDNS chart (github.com/coredns/helm,
# charts/coredns) at a named commit with helm, built from its module
# (hack/tools.sh helm): helm-stock.yaml with the chart's default values,
# helm-rendered.yaml with deploy/helm/values.yaml. The node's end-to-end
# test applies them as `helm upgrade` and `helm rollback` would. The chart
# is read from a clone (CHART_GIT, a git directory; cloned from GitHub
# when unset) and never copied into this repository.
set -euo pipefail

# commit is the chart's tag coredns-1.46.2 (appVersion 1.13.1).
commit=caac03169738feb17b42e110c211f249fa7cf026
release=coredns
namespace=kube-system

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../../.." && pwd)
helm=${HELM:-$("$root/hack/tools.sh" helm)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git_dir=${CHART_GIT:-}
if [[ -z $git_dir ]]; then
	git clone -q --bare --filter=blob:none https://github.com/coredns/helm "$tmp/helm.git"
	git_dir=$tmp/helm.git
fi
git --git-dir "$git_dir" archive "$commit" charts/coredns | tar -x -C "$tmp"
chart_version=$(sed -n 's/^version: //p' "$tmp/charts/coredns/Chart.yaml")
helm_version=$("$helm" version --template '{{.Version}}')

# render OUT [ARGS...] writes helm's output to OUT under a header that
# says how it was made.
render() {
	local out=$1
	shift
	{
		echo "# Rendered by helm $helm_version from the official CoreDNS chart $chart_version"
		echo "# (github.com/coredns/helm, charts/coredns at commit $commit), by"
		echo "# test/e2e/node/testdata/render-helm.sh:"
		echo "#   helm template $release charts/coredns --namespace $namespace${*:+ $*}"
		echo "# Do not edit: run the script again."
		(cd "$root" && "$helm" template "$release" "$tmp/charts/coredns" --namespace "$namespace" "$@")
	} >"$here/$out.tmp"
	mv "$here/$out.tmp" "$here/$out"
}

render helm-stock.yaml
render helm-rendered.yaml -f deploy/helm/values.yaml
