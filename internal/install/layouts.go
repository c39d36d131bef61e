package install

import (
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// layout is one way clusters run CoreDNS: how its Deployment is found
// and told apart, what its ConfigMap holds that another controller keeps
// current, and, for the layouts the tool leaves alone, why and the
// vendor's own way.
type layout struct {
	name string
	// selector finds its Deployment when none is named.
	selector string
	// all of these hold on the Deployment (or its Corefile), and at least
	// one of any when any is given.
	all, any []marker
	// extraKeys are keys of the Corefile's ConfigMap that another
	// controller rewrites, with what rewrites them.
	extraKeys map[string]string
	// inertLabels are labels the layout sets that no controller acts on.
	inertLabels []string
	// refused, when set, is why install leaves the layout alone and the
	// vendor's own way; --force does not go past it.
	refused string
	// warning is what an install on the layout should know.
	warning string
}

// marker is what tells a layout: a label or annotation (key, or key
// prefix ending in "/"; value, or any when empty), a field manager, or
// text of the Corefile.
type marker struct {
	label, annotation, manager, corefile string
	value                                string
}

const reconcileLabel = "addonmanager.kubernetes.io/mode"

// layouts are the layouts the tool knows, the most particular first: the
// first whose markers hold is the Deployment's.
var layouts = []layout{{
	name:     "EKS add-on",
	selector: "k8s-app=kube-dns",
	all:      []marker{{label: "eks.amazonaws.com/component", value: "coredns"}, {manager: "eks"}},
	refused:  "CoreDNS is the EKS add-on coredns (labels eks.amazonaws.com/component: coredns; field manager eks owns the image): EKS puts back its image and Corefile; to run your own, aws eks delete-addon --cluster-name CLUSTER --addon-name coredns --preserve, which keeps the Deployment running unmanaged, then install",
}, {
	name:     "AKS",
	selector: "k8s-app=kube-dns",
	all:      []marker{{label: reconcileLabel, value: "Reconcile"}},
	any:      []marker{{label: "kubernetes.azure.com/"}, {corefile: "import custom/"}},
	refused:  "CoreDNS is AKS's (label addonmanager.kubernetes.io/mode: Reconcile, kubernetes.azure.com labels or import custom/*): AKS supports no third-party plugins in its CoreDNS and puts back its Deployment and Corefile; what AKS lets you change is the ConfigMap coredns-custom (its *.server and *.override keys), with built-in plugins only",
}, {
	name:     "RKE2",
	selector: "k8s-app=kube-dns",
	all:      []marker{{annotation: "meta.helm.sh/release-name", value: "rke2-coredns"}},
	refused:  "CoreDNS is RKE2's rke2-coredns, a helm release that helm-controller keeps (HelmChart kube-system/rke2-coredns): it puts back the chart's Deployment and Corefile; set them in a HelmChartConfig named rke2-coredns in kube-system, whose valuesContent sets image.repository and image.tag, k8s_event in servers[].plugins and the four downward-API variables in env",
}, {
	name:      "k3s",
	selector:  "k8s-app=kube-dns",
	all:       []marker{{annotation: "objectset.rio.cattle.io/"}},
	extraKeys: map[string]string{"NodeHosts": "k3s"},
}, {
	name:        "kubespray",
	selector:    "k8s-app=kube-dns",
	all:         []marker{{label: "k8s-app", value: "kube-dns"}, {label: "kubernetes.io/name", value: "coredns"}, {label: reconcileLabel, value: "Reconcile"}},
	inertLabels: []string{reconcileLabel},
	warning:     "kubespray applies its CoreDNS Deployment again on its next run of cluster.yml or upgrade-cluster.yml, which puts back its image and ConfigMap: run install again after it",
}, {
	name:     "EKS, self-managed",
	selector: "k8s-app=kube-dns",
	all:      []marker{{label: "eks.amazonaws.com/component", value: "coredns"}},
}, {
	name:     "CoreDNS helm chart",
	selector: "app.kubernetes.io/name=coredns",
	all:      []marker{{label: "app.kubernetes.io/name", value: "coredns"}},
}, {
	name:     "kubeadm, kind",
	selector: "k8s-app=kube-dns",
	all:      []marker{{label: "k8s-app", value: "kube-dns"}},
}}

// custom is the layout of a Deployment no row describes.
var customLayout = layout{name: "custom"}

// selectors are the label selectors that find CoreDNS, each once.
func selectors() []string {
	var out []string
	for _, l := range layouts {
		if !slices.Contains(out, l.selector) {
			out = append(out, l.selector)
		}
	}
	return out
}

// layoutOf is the layout of d, whose Corefile is corefile.
func layoutOf(d *appsv1.Deployment, corefile string) *layout {
	for i := range layouts {
		l := &layouts[i]
		holds := func(m marker) bool { return m.holds(d, corefile) }
		if slices.ContainsFunc(l.all, func(m marker) bool { return !holds(m) }) {
			continue
		}
		if len(l.any) > 0 && !slices.ContainsFunc(l.any, holds) {
			continue
		}
		return l
	}
	return &customLayout
}

func (m marker) holds(d *appsv1.Deployment, corefile string) bool {
	switch {
	case m.label != "":
		return hasKey(d.Labels, m.label, m.value)
	case m.annotation != "":
		return hasKey(d.Annotations, m.annotation, m.value)
	case m.manager != "":
		return slices.ContainsFunc(d.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == m.manager })
	default:
		return strings.Contains(corefile, m.corefile)
	}
}

// hasKey reports whether kv has key (or, for a key ending in "/", a key
// with that prefix) with value, or any value when value is empty.
func hasKey(kv map[string]string, key, value string) bool {
	for k, v := range kv {
		if (k == key || strings.HasSuffix(key, "/") && strings.HasPrefix(k, key)) && (value == "" || v == value) {
			return true
		}
	}
	return false
}

// extraKeyOwner is what rewrites key of the Corefile's ConfigMap, or "".
func extraKeyOwner(key string) string {
	for _, l := range layouts {
		if who, ok := l.extraKeys[key]; ok {
			return who
		}
	}
	return ""
}

// extraKeys are the keys some layout's controller rewrites, sorted.
func extraKeys() []string {
	var out []string
	for _, l := range layouts {
		for k := range l.extraKeys {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
