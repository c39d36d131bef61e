package install

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// The startup event: node-local-dns settles on an event of k8s_event on
// each new pod, of the one line CoreDNS logs at start whatever the
// Corefile, the reload plugin's `[INFO] plugin/reload: Running
// configuration SHA512 = ...`: an info line, which k8s_event writes only
// with info among its levels (its defaults are error and warning).
const (
	startupLine = "[INFO] plugin/reload: Running configuration SHA512 = ..."
	// eventLevels are the levels the install gives k8s_event where the
	// rollout settles on its startup event and neither --option nor the
	// Corefile sets them: its defaults, and info.
	eventLevels = "level info warning error"
)

// The longest a new pod may take to write its startup event, from its
// start: a write (k8s_event's writeTimeout); with fleet, before it, the
// herd spread (herdMaxWindow, while N is not known) and the reads of N
// the first write waits for (fleetReads, each up to writeTimeout). See
// docs/design.md, A fleet.
var (
	eventWrite = 10 * time.Second
	eventHerd  = 30 * time.Second
	eventReads = 3
)

// eventWait is how long after its start a new pod may take to write its
// startup event, with or without fleet.
func eventWait(fleet bool) time.Duration {
	if !fleet {
		return eventWrite
	}
	return eventHerd + time.Duration(eventReads)*eventWrite + eventWrite
}

// eventSettle is how a rollout that settles on the startup event waits
// for it.
type eventSettle struct {
	// wait is how long after its start each new pod has to write it; 0:
	// not waited for, readiness and restarts decide.
	wait time.Duration
	// why it is not waited for, for the report.
	why string
}

// planLevels gives k8s_event the levels with info (eventLevels) where the
// rollout settles on the startup event and neither --option nor the
// Corefile sets its levels.
func (pl *planner) planLevels(t *target, cf *corefileText) {
	pl.level = ""
	if t.settlesOnEvent() && optionLine(pl.o.Options, "level") == "" && corefileLine(cf, "level") == "" {
		pl.level = eventLevels
	}
}

// planEvent decides how the rollout of t settles on the startup event,
// from out, the Corefile the new pods read: it refuses (with Force,
// warns of) a Corefile whose k8s_event would not write it.
func (pl *planner) planEvent(t *target, out string, m *mountedFiles) []string {
	if !t.settlesOnEvent() {
		return nil
	}
	cf, err := parseCorefile(out, m)
	if err != nil {
		return nil // the plan's own check says it
	}
	why := eventRefusal(pl.o.Options, cf)
	switch {
	case why == "":
		t.events = eventSettle{wait: eventWait(pl.fleet.on)}
		return nil
	case pl.o.Force:
		pl.warn("--force: " + why + "; the rollout settles on readiness and restarts alone")
		t.events = eventSettle{why: "--force went past: " + why}
		return nil
	}
	return []string{why + "; or --force to settle on readiness and restarts alone"}
}

// eventRefusal is why the k8s_event of cf would not write the startup
// event, naming the option; "" when it would.
func eventRefusal(options []string, cf *corefileText) string {
	settles := fmt.Sprintf("node-local-dns settles on k8s_event's event of the reload plugin's startup line (%s) on each new pod, the only line CoreDNS logs at start", startupLine)
	if !cf.has("reload") {
		return "the Corefile has no reload directive in a server block: " + settles + ", and without reload none logs it; add reload to a server block"
	}
	if levelsHaveInfo(cf) {
		return ""
	}
	from := "the Corefile's k8s_event sets " + strconv.Quote(corefileLine(cf, "level"))
	if own := optionLine(options, "level"); own != "" {
		from = "--option " + strconv.Quote(own) + " sets k8s_event's levels"
	}
	return from + " without info: " + settles + ", an info line, which k8s_event writes only with info among its levels; add info to the level option (level info warning error)"
}

// levelsHaveInfo reports whether a k8s_event stanza of cf has info among
// its levels: k8s_event takes the levels of all its stanzas together.
func levelsHaveInfo(cf *corefileText) bool {
	for _, line := range corefileLines(cf, "level") {
		if slices.ContainsFunc(strings.Fields(line)[1:], func(l string) bool { return strings.EqualFold(l, "info") }) {
			return true
		}
	}
	return false
}

// pluginEvents waits until each of pods has an event that k8s_event wrote
// on it, told by the pod's UID, each for up to wait from the start of its
// container t names (or from when the wait began, for a pod whose start
// is not known), within ctx. A pod with none by then fails the rollout:
// k8s_event did not start on it, or cannot write.
func pluginEvents(ctx context.Context, c kubernetes.Interface, pods []corev1.Pod, t *target, wait time.Duration) error {
	begun := time.Now()
	due := func(p *corev1.Pod) time.Time {
		if at := containerStarted(p, t); !at.IsZero() && at.Before(begun) {
			return at.Add(wait)
		}
		return begun.Add(wait)
	}
	pending := slices.Clone(pods)
	var lastErr error
	for {
		pending, lastErr = withoutEvent(ctx, c, pending)
		if len(pending) == 0 {
			return nil
		}
		if apierrors.IsForbidden(lastErr) || apierrors.IsUnauthorized(lastErr) {
			return fmt.Errorf("the events of the new pods cannot be read (%v): node-local-dns settles on k8s_event's startup event on each", lastErr)
		}
		last := slices.MaxFunc(pending, func(a, b corev1.Pod) int { return due(&a).Compare(due(&b)) })
		if !time.Now().Before(due(&last)) {
			return noEvent(pending, wait, lastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the rollout's deadline, --timeout and the settle time, passed)", noEvent(pending, wait, lastErr))
		case <-time.After(eventPoll):
		}
	}
}

// containerStarted is when the container t names last started running
// in p; zero when not known. The pod's own start time comes before its
// image is pulled.
func containerStarted(p *corev1.Pod, t *target) time.Time {
	if t == nil || t.container >= len(p.Spec.Containers) {
		return time.Time{}
	}
	if cs := containerStatus(p, t); cs != nil && cs.State.Running != nil {
		return cs.State.Running.StartedAt.Time
	}
	return time.Time{}
}

// eventPoll is how often pluginEvents reads the events.
var eventPoll = time.Second

// withoutEvent are the pods of pods with no event of k8s_event yet, and
// the error of a read that failed (its pods kept).
func withoutEvent(ctx context.Context, c kubernetes.Interface, pods []corev1.Pod) ([]corev1.Pod, error) {
	var none []corev1.Pod
	var lastErr error
	for _, p := range pods {
		list, err := c.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: eventLabel,
			FieldSelector: "involvedObject.name=" + p.Name,
		})
		if err != nil {
			none, lastErr = append(none, p), err
			continue
		}
		if !slices.ContainsFunc(list.Items, func(e corev1.Event) bool { return e.InvolvedObject.UID == p.UID }) {
			none = append(none, p)
		}
	}
	return none, lastErr
}

// noEvent is the failure of pods that wrote no startup event.
func noEvent(pods []corev1.Pod, wait time.Duration, readErr error) error {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	msg := fmt.Sprintf("no event of k8s_event on pod %s within %v of its start: k8s_event writes one of the reload plugin's startup line (%s) at start; it did not start there, or cannot write events (kubectl -n %s logs POD says which)", strings.Join(names, ", "), wait, startupLine, pods[0].Namespace)
	if readErr != nil {
		msg += fmt.Sprintf("; the last read of the events failed: %v", readErr)
	}
	return errors.New(msg)
}
