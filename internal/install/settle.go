package install

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// defaultSettle is how long, at least, the new pods must stay Ready
// without a restart before a rollout counts as done: a pod whose program
// passes readiness and then exits (or whose readiness another pod on the
// node's network answered) fails within it.
var defaultSettle = 20 * time.Second

// settleFor is the settle time of w's rollout: o's, or the default, or
// w's minReadySeconds when longer.
func settleFor(w workload, o *Options) time.Duration {
	s := defaultSettle
	if o.Settle > 0 {
		s = o.Settle
	}
	return max(s, time.Duration(w.minReadySeconds())*time.Second)
}

// podWatch is what settle saw of one pod of the new template.
type podWatch struct {
	restarts int32
}

// settle waits until the pods of the template w runs have all been Ready,
// without a restart, for the settle time, as this process's clock
// measures it, and then asks each, on its own address, a DNS question
// (where the layout's pods answer on the node's address, which the
// installer cannot ask, it looks for k8s_event's events on them instead).
// A pod that restarts, stops being Ready or goes within that time, or
// that does not answer where it can be asked, fails the rollout. It
// returns what it could not check, for the report.
func settle(ctx context.Context, c kubernetes.Interface, w workload, t *target, settleTime time.Duration) (string, error) {
	return settlePods(ctx, c, w, t, settleTime, int(w.replicas()), nil)
}

// settlePods is settle for want pods of the template, those that keep
// says, or all when keep is nil.
func settlePods(ctx context.Context, c kubernetes.Interface, w workload, t *target, settleTime time.Duration, want int, keep func(*corev1.Pod) bool) (string, error) {
	seen := map[string]*podWatch{}
	var since time.Time // when every pod was first Ready; zero: not yet
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, settleTime+time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := templatePods(ctx, c, w, t)
		if err != nil {
			return false, stopOn(err)
		}
		if keep != nil {
			list = slices.DeleteFunc(list, func(p corev1.Pod) bool { return !keep(&p) })
		}
		pods = list
		ready := 0
		for _, p := range list {
			w, ok := seen[p.Name]
			rs := restarts(&p, t)
			switch {
			case !ok && rs > 0:
				return false, fmt.Errorf("pod %s of the new template restarted %d times", p.Name, rs)
			case !ok:
				seen[p.Name] = &podWatch{restarts: rs}
			case rs != w.restarts:
				return false, fmt.Errorf("pod %s of the new template restarted within the settle time (%v)%s", p.Name, settleTime, lastState(&p, t))
			}
			if podReady(&p) {
				ready++
			} else if !since.IsZero() {
				return false, fmt.Errorf("pod %s of the new template stopped being Ready within the settle time (%v)%s", p.Name, settleTime, lastState(&p, t))
			}
		}
		switch {
		case ready < want && !since.IsZero():
			return false, fmt.Errorf("%d of %d pods of the new template Ready within the settle time (%v): a pod went", ready, want, settleTime)
		case ready < want:
			return false, nil
		case since.IsZero():
			since = time.Now()
		}
		return time.Since(since) >= settleTime, nil
	})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", fmt.Errorf("the pods of the new template were not all Ready for %v without a restart within --timeout and the settle time", settleTime)
		}
		if wait.Interrupted(err) {
			return "", fmt.Errorf("the pods of the new template were not all Ready for %v without a restart", settleTime)
		}
		return "", err
	}
	if t.settlesOnEvent() {
		return settleOnEvent(ctx, c, pods, t)
	}
	return askPods(ctx, pods, t)
}

// settleOnEvent waits for k8s_event's startup event on each of the new
// pods, where the plan said to; else it says that readiness and restarts
// decided.
func settleOnEvent(ctx context.Context, c kubernetes.Interface, pods []corev1.Pod, t *target) (string, error) {
	if t.events.wait > 0 {
		return "", pluginEvents(ctx, c, pods, t, t.events.wait)
	}
	why := cmp.Or(t.events.why, "the new pods' DNS address is the node's, which the installer cannot ask, and they run no k8s_event to wait for")
	return "DNS not asked and no startup event waited for (" + why + "): readiness and restarts decided", nil
}

// stopOn is err where waiting longer cannot help (the run may not read
// what it waits on), else nil: the poll tries again.
func stopOn(err error) error {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		return err
	}
	return nil
}

// restarted fails a rollout whose new pods' container has restarted.
func restarted(ctx context.Context, c kubernetes.Interface, w workload, t *target) error {
	pods, err := templatePods(ctx, c, w, t)
	if err != nil {
		return stopOn(err)
	}
	for _, p := range pods {
		if n := restarts(&p, t); n > 0 {
			return fmt.Errorf("%s did not roll out: pod %s of the new template restarted %d times%s", ref(w), p.Name, n, lastState(&p, t))
		}
	}
	return nil
}

// templatePods are the pods that run w's template: its image, its config
// volume, its record.
func templatePods(ctx context.Context, c kubernetes.Interface, w workload, t *target) ([]corev1.Pod, error) {
	list, err := pods(ctx, c, w)
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list {
		if p.DeletionTimestamp == nil && runsTemplate(&p, w.template(), t) {
			out = append(out, p)
		}
	}
	return out, nil
}

// runsTemplate reports whether p runs tmpl in what the install sets: the
// image, the config volume, the record.
func runsTemplate(p *corev1.Pod, tmpl *corev1.PodTemplateSpec, t *target) bool {
	spec := &tmpl.Spec
	if t.container >= len(p.Spec.Containers) || t.volume >= len(p.Spec.Volumes) || t.container >= len(spec.Containers) || t.volume >= len(spec.Volumes) {
		return false
	}
	pv, tv := p.Spec.Volumes[t.volume].ConfigMap, spec.Volumes[t.volume].ConfigMap
	return p.Spec.Containers[t.container].Image == spec.Containers[t.container].Image && (pv == nil) == (tv == nil) &&
		(pv == nil || pv.Name == tv.Name) && p.Annotations[Annotation] == tmpl.Annotations[Annotation]
}

func containerStatus(p *corev1.Pod, t *target) *corev1.ContainerStatus {
	name := p.Spec.Containers[t.container].Name
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func restarts(p *corev1.Pod, t *target) int32 {
	if cs := containerStatus(p, t); cs != nil {
		return cs.RestartCount
	}
	return 0
}

// lastState says how the container last ended, when it did.
func lastState(p *corev1.Pod, t *target) string {
	cs := containerStatus(p, t)
	if cs == nil {
		return ""
	}
	for _, s := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
		if s != nil {
			return fmt.Sprintf(": container %s terminated: %s (exit %d)", cs.Name, s.Reason, s.ExitCode)
		}
	}
	return ""
}

// dnsPort is the UDP port the container declares for DNS, or 0.
func dnsPort(ctr *corev1.Container) int32 {
	var port int32
	for _, p := range ctr.Ports {
		if p.Protocol == corev1.ProtocolUDP || p.Protocol == "" {
			if p.Name == "dns" || port == 0 {
				port = p.ContainerPort
			}
		}
	}
	return port
}

// askPods asks each pod a DNS question on its own address. A pod that is
// reachable and does not answer fails; where the question cannot reach
// the pod, or could reach another pod (the node's network), readiness
// decides, and what was not checked is returned.
func askPods(ctx context.Context, pods []corev1.Pod, t *target) (string, error) {
	var unchecked []string
	for _, p := range pods {
		port := dnsPort(&p.Spec.Containers[t.container])
		switch {
		case p.Spec.HostNetwork:
			unchecked = append(unchecked, p.Name+" shares the node's network, where another pod could answer")
			continue
		case port == 0 || p.Status.PodIP == "":
			unchecked = append(unchecked, p.Name+" declares no DNS port, or has no address yet")
			continue
		}
		addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))
		switch err := askDNS(ctx, addr); {
		case err == nil:
		case errors.Is(err, syscall.ECONNREFUSED):
			return "", fmt.Errorf("pod %s is Ready but does not answer DNS on %s: %v", p.Name, addr, err)
		default:
			unchecked = append(unchecked, fmt.Sprintf("%s at %s is not reachable from here (%v)", p.Name, addr, err))
		}
	}
	if len(unchecked) == 0 {
		return "", nil
	}
	return "DNS not asked of " + strings.Join(unchecked, "; ") + ": readiness and restarts decided", nil
}

// askDNS asks addr for the root's NS records; any answer, of any rcode,
// is an answer.
func askDNS(ctx context.Context, addr string) error {
	m := new(dns.Msg)
	m.SetQuestion(".", dns.TypeNS)
	cl := &dns.Client{Net: "udp", Timeout: time.Second}
	var err error
	for range 3 {
		if _, _, err = cl.ExchangeContext(ctx, m, addr); err == nil {
			return nil
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
	}
	return err
}
