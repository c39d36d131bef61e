package install

import (
	"path"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// layout is one way clusters run CoreDNS: how its Deployment is found
// and told apart, what its ConfigMap holds that another controller keeps
// current, and, for the layouts the tool leaves alone, why and the
// vendor's own way.
type layout struct {
	name string
	// kind is the kind of the workload that runs CoreDNS in the layout
	// (Deployment, DaemonSet); "" for either.
	kind string
	// namespace, when set, is where the layout runs CoreDNS: status and
	// refusals name it.
	namespace string
	// selector finds its workload when none is named.
	selector string
	// all of these hold on the Deployment (or its Corefile), and at least
	// one of any when any is given.
	all, any []marker
	// extraKeys are keys of the Corefile's ConfigMap that another
	// controller rewrites, with what rewrites them.
	extraKeys map[string]string
	// refused, when set, is why install leaves the layout alone and the
	// vendor's own way; --force does not go past it.
	refused string
	// warning is what an install on the layout should know.
	warning string
	// everyBlock, that every server block of the Corefile gets kubeapi
	// and k8s_event, not only those with the kubernetes plugin.
	everyBlock bool
	// image, when set, says why an image cannot run the layout ("" when
	// it may); --force goes past it.
	image func(image string) string
	// settleEvent, that the new pods' DNS address cannot be asked (the
	// node's own): settled is Ready without a restart for the settle
	// time, and k8s_event's events on the new pods are looked for.
	settleEvent bool
}

// marker is what tells a layout: a label or annotation (key, or key
// prefix ending in "/"; value, or any when empty), a field manager, an
// owner (API group/kind of an owner reference), the program the pods run
// (nodeCacheProgram), or text of the Corefile.
// A label marker with objects holds when the workload or the Corefile's
// ConfigMap carries it.
type marker struct {
	label, annotation, manager, owner, program, corefile string
	value                                                string
	objects                                              bool
}

// subject is what a layout is told from: the workload that runs CoreDNS
// (its kind and metadata), its Corefile and that Corefile's ConfigMap.
type subject struct {
	kind     string
	meta     *metav1.ObjectMeta
	corefile string
	// configMap are the labels of the Corefile's ConfigMap.
	configMap map[string]string
	// program is what the pods run, as programOf tells it.
	program string
}

// Kinds of the workloads that run CoreDNS.
const (
	kindDeployment = "Deployment"
	kindDaemonSet  = "DaemonSet"
)

const reconcileLabel = "addonmanager.kubernetes.io/mode"

// layouts are the layouts the tool knows, the most particular first: the
// first whose markers hold is the Deployment's.
var layouts = []layout{{
	name:      "OpenShift",
	kind:      kindDaemonSet,
	namespace: "openshift-dns",
	selector:  "dns.operator.openshift.io/owning-dns=default",
	any:       []marker{{label: "dns.operator.openshift.io/owning-dns"}, {owner: "operator.openshift.io/DNS"}},
	refused:   "CoreDNS is OpenShift's: the DNS operator (dns.operator.openshift.io/default) owns DaemonSet openshift-dns/dns-default and puts back its image and Corefile; OpenShift takes no third-party plugins in it; what the operator lets you change is its own spec (oc edit dns.operator/default: servers for per-zone forwarding, upstreamResolvers, logLevel, nodePlacement), built-in plugins only",
}, {
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
	name:     "kubespray",
	selector: "k8s-app=kube-dns",
	all:      []marker{{label: "k8s-app", value: "kube-dns"}, {label: "kubernetes.io/name", value: "coredns"}, {label: reconcileLabel, value: "Reconcile"}},
	warning:  "kubespray applies its CoreDNS Deployment again on its next run of cluster.yml or upgrade-cluster.yml, which puts back its image and ConfigMap: run install again after it",
}, {
	name:        "kubespray node-local-dns",
	kind:        kindDaemonSet,
	all:         []marker{{program: nodeCacheProgram}, {label: "k8s-app", value: "kube-dns"}},
	everyBlock:  true,
	image:       notNodeCache,
	settleEvent: true,
	warning:     "kubespray applies its nodelocaldns DaemonSet and ConfigMap again on its next run of cluster.yml or upgrade-cluster.yml, which puts back their image and Corefile: run install again after it",
}, {
	name:    "node-local-dns, addon manager (GKE, kube-up)",
	kind:    kindDaemonSet,
	all:     []marker{{program: nodeCacheProgram}, {label: reconcileLabel, value: "Reconcile", objects: true}},
	refused: "node-local-dns is an addon in Reconcile mode (label addonmanager.kubernetes.io/mode: Reconcile): the addon manager puts back its DaemonSet and ConfigMap within a minute, edits included; on GKE, NodeLocal DNSCache is GKE's add-on, turned on and off with gcloud container clusters update CLUSTER --update-addons=NodeLocalDNS=ENABLED|DISABLED, with no third-party plugins in it: turn it off (NodeLocalDNS=DISABLED) and run your own node-local-dns (upstream's cluster/addons/dns/nodelocaldns manifest without that label) on a node-cache build with k8s_event; on kube-up, change the addon's manifest under /etc/kubernetes/addons on the control plane (or set the label to EnsureExists on each object first, which the addon manager then only creates when missing)",
}, {
	name:    "addon manager (kube-up, GKE)",
	all:     []marker{{label: reconcileLabel, value: "Reconcile", objects: true}},
	refused: "CoreDNS is an addon in Reconcile mode (label addonmanager.kubernetes.io/mode: Reconcile): the addon manager puts back its manifest within a minute, edits included; on kube-up, change the addon's manifest under /etc/kubernetes/addons on the control plane (or set the label to EnsureExists on each object first, which the addon manager then only creates when missing); on GKE, whose control plane is not yours, turn the add-on off (NodeLocal DNSCache: gcloud container clusters update CLUSTER --update-addons=NodeLocalDNS=DISABLED) and run your own",
}, {
	name:        "node-local-dns",
	kind:        kindDaemonSet,
	all:         []marker{{program: nodeCacheProgram}},
	everyBlock:  true,
	image:       notNodeCache,
	settleEvent: true,
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

// selectors are the label selectors that find CoreDNS run as kind, each
// once.
func selectors(kind string) []string {
	var out []string
	for _, l := range layouts {
		if l.selector != "" && (l.kind == "" || l.kind == kind) && !slices.Contains(out, l.selector) {
			out = append(out, l.selector)
		}
	}
	return out
}

// layoutOf is the layout of s.
func layoutOf(s subject) *layout {
	for i := range layouts {
		l := &layouts[i]
		if l.kind != "" && l.kind != s.kind {
			continue
		}
		holds := func(m marker) bool { return m.holds(s) }
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

func (m marker) holds(s subject) bool {
	d := s.meta
	switch {
	case m.label != "":
		return hasKey(d.Labels, m.label, m.value) || m.objects && hasKey(s.configMap, m.label, m.value)
	case m.annotation != "":
		return hasKey(d.Annotations, m.annotation, m.value)
	case m.manager != "":
		return slices.ContainsFunc(d.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == m.manager })
	case m.program != "":
		return s.program == m.program
	case m.owner != "":
		group, kind := path.Split(m.owner)
		return slices.ContainsFunc(d.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == kind && strings.HasPrefix(r.APIVersion, group)
		})
	default:
		return strings.Contains(s.corefile, m.corefile)
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
