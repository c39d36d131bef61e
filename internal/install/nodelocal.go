package install

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	imageref "github.com/dnsops/k8s_event/internal/image"
)

// NodeLocal DNSCache (node-local-dns) runs node-cache, a CoreDNS build of
// k8s.io/dns (cmd/node-cache), as a DaemonSet: besides serving DNS, it
// sets up an interface and iptables rules on each node for its local
// address (169.254.20.10 in upstream's manifest), and takes them down
// when it stops. Its ConfigMap holds a Corefile template, with
// __PILLAR__ placeholders that node-cache fills at start.

// nodeCacheProgram is the program marker of a workload that runs
// node-cache.
const nodeCacheProgram = "node-cache"

// nodeCacheTemplate is where node-cache reads its Corefile template when
// -basecorefile does not say.
const nodeCacheTemplate = "/etc/coredns/Corefile.base"

// runsNodeCache reports whether a container with args runs node-cache:
// -localip is its flag, and CoreDNS has none of that name.
func runsNodeCache(args []string) bool {
	_, ok := flagValue(args, "localip")
	return ok
}

// corefilePath is the path in the pods of the Corefile that the config
// volume gives a container with args: node-cache's template (its -conf
// is the Corefile it writes from that template), else CoreDNS's -conf.
func corefilePath(args []string) string {
	if !runsNodeCache(args) {
		return confPath(args)
	}
	if v, ok := flagValue(args, "basecorefile"); ok {
		return v
	}
	return nodeCacheTemplate
}

// flagValue is the value of the Go flag name in args, given as -name
// value, -name=value, or with two dashes.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name && i+1 < len(args) && strings.HasPrefix(args[i], "-") {
			return args[i+1], true
		}
	}
	return "", false
}

// programOf is the program marker of the pods of spec: nodeCacheProgram
// when a container runs node-cache, else "".
func programOf(spec *corev1.PodSpec) string {
	for _, c := range spec.Containers {
		if runsNodeCache(append(slices.Clone(c.Command), c.Args...)) {
			return nodeCacheProgram
		}
	}
	return ""
}

// isNodeCacheImage reports whether ref names a node-cache image: its
// tag is node-cache's release, not CoreDNS's.
func isNodeCacheImage(ref string) bool {
	return strings.Contains(path.Base(imageref.ParseReference(ref).Name), "node-cache")
}

// notNodeCache says why image is plainly not a node-cache build: its
// repository names CoreDNS (coredns/coredns, registry.k8s.io/coredns/
// coredns, k8s_event's own coredns-k8s-event) and not node-cache; ""
// when it may be one.
func notNodeCache(image string) string {
	base := path.Base(imageref.ParseReference(image).Name)
	if image == "" || !strings.Contains(base, "coredns") || strings.Contains(base, "node-cache") {
		return ""
	}
	return fmt.Sprintf("image %s is CoreDNS, not node-cache: node-cache also sets up the node's interface and iptables rules for node-local-dns's address, takes them down when it stops, and fills the __PILLAR__ placeholders of the Corefile template; CoreDNS does none of that, and its pods would not serve the node's DNS; build node-cache with k8s_event (docs/install.md, node-local-dns) and name that image, or --force if this image is such a build", image)
}

// checkNodeCacheRelease warns when Options.Image may not be a build of
// the node-cache release that running is: a node-cache tag is its own
// release, which decides its CoreDNS too; a build tagged from it
// (1.26.4-k8s-event) keeps it.
func (pl *planner) checkNodeCacheRelease(running string) {
	have := imageref.ParseReference(running).Tag
	want := imageref.ParseReference(pl.o.Image).Tag
	if have != "" && (want == have || strings.HasPrefix(want, have+"-")) {
		return
	}
	pl.warn(fmt.Sprintf("image %s may not be a build of the node-cache release the pods run (image %s): node-cache's release decides its CoreDNS too; a build tagged %s-k8s-event says it is one", pl.o.Image, running, cmp.Or(have, "RELEASE")))
}

// imageRefusal is why the layout must not run Options.Image (with Force,
// a warning).
func (pl *planner) imageRefusal(l *layout) error {
	if l.image == nil {
		return nil
	}
	why := l.image(pl.o.Image)
	switch {
	case why == "":
		return nil
	case pl.o.Force:
		pl.warn("--force: " + why)
		return nil
	}
	return &RefusedError{[]string{why}}
}

// settlesOnEvent reports whether the target's rollout settles only with
// k8s_event's word from the new pods: their DNS address is the node's,
// which the installer cannot ask.
func (t *target) settlesOnEvent() bool {
	return t.layout != nil && t.layout.settleEvent
}

// eventLabel is a label k8s_event puts on every event it writes.
const eventLabel = "coredns.io/level"

// pluginEvents looks, once, for an event that k8s_event wrote on each of
// the new pods, by the pod's UID, and says which pods it found none on:
// k8s_event writes an event of a line at one of its levels, so a pod with
// none may be running it still.
func pluginEvents(ctx context.Context, c kubernetes.Interface, pods []corev1.Pod) string {
	var none []string
	for _, p := range pods {
		list, err := c.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: eventLabel,
			FieldSelector: "involvedObject.name=" + p.Name,
		})
		if err != nil {
			return fmt.Sprintf("the events of the new pods not read (%v): readiness and restarts decided", err)
		}
		if !slices.ContainsFunc(list.Items, func(e corev1.Event) bool { return e.InvolvedObject.UID == p.UID }) {
			none = append(none, p.Name)
		}
	}
	if len(none) == 0 {
		return ""
	}
	return "no event of k8s_event yet on " + strings.Join(none, ", ") + " (it writes one for a line at its levels): readiness and restarts decided"
}
