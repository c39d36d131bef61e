package install

import (
	"bytes"
	"context"
	"errors"
	coordinationv1 "k8s.io/api/coordination/v1"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	k8stesting "k8s.io/client-go/testing"
)

// hooked runs a function once, the first time a ReplicaSet list is made:
// the moment an install works out what it may prune.
type hooked struct {
	kubernetes.Interface
	once   *sync.Once
	onList func()
}

func (h hooked) AppsV1() appsv1client.AppsV1Interface { return hookedApps{h.Interface.AppsV1(), h} }

type hookedApps struct {
	appsv1client.AppsV1Interface
	h hooked
}

func (a hookedApps) ReplicaSets(ns string) appsv1client.ReplicaSetInterface {
	return hookedRS{a.AppsV1Interface.ReplicaSets(ns), a.h}
}

type hookedRS struct {
	appsv1client.ReplicaSetInterface
	h hooked
}

func (r hookedRS) List(ctx context.Context, o metav1.ListOptions) (*appsv1.ReplicaSetList, error) {
	list, err := r.ReplicaSetInterface.List(ctx, o)
	r.h.once.Do(r.h.onList)
	return list, err
}

// Two installs at once: the second, run while the first works out what
// to prune, is refused, and the Deployment reads a ConfigMap that is
// there.
func TestInstallTwoAtOnceLeaveTheCorefileThere(t *testing.T) {
	ctx := context.Background()
	base := newClient(deployment(), configMap())
	var second error
	var out2 bytes.Buffer
	c := hooked{Interface: base, once: &sync.Once{}, onList: func() {
		second = Install(ctx, base, Options{Image: image, Options: []string{"level info warning error"}, Out: &out2})
	}}
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: image, Out: &out}); err != nil {
		t.Fatalf("first install: %v\n%s", err, out.String())
	}
	vol := get(t, base).Spec.Template.Spec.Volumes[0].ConfigMap.Name
	if _, err := base.CoreV1().ConfigMaps("kube-system").Get(ctx, vol, metav1.GetOptions{}); err != nil {
		t.Errorf("the Deployment reads configmap %s: %v\nfirst:\n%s\nsecond (%v):\n%s", vol, err, out.String(), second, out2.String())
	}
	if second == nil || !strings.Contains(second.Error(), "another kubectl k8s-event run") || !IsRefused(second) {
		t.Errorf("the second install: %v, want it refused while the first runs", second)
	}
	if _, err := base.CoordinationV1().Leases("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{}); err == nil {
		t.Errorf("the lease is still there after the install")
	}
}

// A dry run takes no Lease, but says when another run holds it: the real
// run would be refused.
func TestDryRunSaysAnotherRunHoldsTheLease(t *testing.T) {
	ctx := context.Background()
	base := newClient(deployment(), configMap())
	var dry, undry bytes.Buffer
	var dryErr, undryErr error
	c := hooked{Interface: base, once: &sync.Once{}, onList: func() {
		dryErr = Install(ctx, base, Options{Image: image, DryRun: true, Out: &dry})
		undryErr = Uninstall(ctx, base, Options{DryRun: true, Out: &undry})
	}}
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		err error
		out string
	}{{dryErr, dry.String()}, {undryErr, undry.String()}} {
		if r.err != nil || !strings.Contains(r.out, "warning: the run would be refused now: another kubectl k8s-event run") {
			t.Errorf("a dry run while another run holds the lease: %v\n%s", r.err, r.out)
		}
	}
}

// An install cut off before its patch of the Deployment (refused by the
// API server, or interrupted) takes back the ConfigMap, Role and
// RoleBinding it created; one whose patch went through, with only the
// answer lost, keeps the ConfigMap the pods now read.
func TestInstallCutOffBeforeThePatchTakesBackWhatItCreated(t *testing.T) {
	ctx := context.Background()
	for _, applied := range []bool{false, true} {
		c := newClient(deployment(), configMap())
		c.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if isDryRun(a) {
				return false, nil, nil
			}
			if applied {
				_, _, _ = k8stesting.ObjectReaction(c.Tracker())(a)
			}
			return true, nil, errors.New("http2: client connection lost")
		})
		if err := Install(ctx, c, Options{Image: image}); err == nil {
			t.Fatalf("install with the patch failing: no error")
		}
		cms, _ := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
		roles, _ := c.RbacV1().Roles("kube-system").List(ctx, metav1.ListOptions{})
		vol := get(t, c).Spec.Template.Spec.Volumes[0].ConfigMap.Name
		switch {
		case !applied && (len(cms.Items) != 1 || len(roles.Items) != 0):
			t.Errorf("after a patch refused: %d configmaps (want the operator's only), %d roles", len(cms.Items), len(roles.Items))
		case applied:
			if _, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, vol, metav1.GetOptions{}); err != nil {
				t.Errorf("the patch went through, but configmap %s, which the pods read: %v", vol, err)
			}
		}
	}
}

// TestMain shortens the Lease's times and the settle time for the tests
// that do not measure them: a run waits out another's Lease for its
// duration, and every rollout for its settle time.
func TestMain(m *testing.M) {
	leaseTimes = leaseTiming{duration: time.Second, renew: 100 * time.Millisecond, poll: 20 * time.Millisecond}
	defaultSettle = 300 * time.Millisecond
	os.Exit(m.Run())
}

// otherRunsLease is a Lease another run holds, written by a machine whose
// clock is off from this one's by skew.
func otherRunsLease(skew time.Duration) *coordinationv1.Lease {
	l := newLease("kube-system", "coredns-k8s-event", "coredns")
	at := metav1.NewMicroTime(time.Now().Add(skew))
	l.Spec.AcquireTime, l.Spec.RenewTime = &at, &at
	return l
}

// A Lease that its run keeps renewing is refused, however far behind the
// clock of the machine that renews it: its renewTime says nothing to this
// machine's clock; that it changes does.
func TestLeaseRenewedByALiveRunIsRefusedWhateverItsClock(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap(), otherRunsLease(-time.Hour))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(leaseTimes.renew):
			}
			l, err := c.CoordinationV1().Leases("kube-system").Get(ctx, "coredns-k8s-event", metav1.GetOptions{})
			if err != nil {
				continue
			}
			at := metav1.NewMicroTime(time.Now().Add(-time.Hour + time.Duration(i)*time.Millisecond))
			l.Spec.RenewTime = &at
			_, _ = c.CoordinationV1().Leases("kube-system").Update(ctx, l, metav1.UpdateOptions{})
		}
	}()
	if err := Install(ctx, c, Options{Image: image}); !IsRefused(err) || !strings.Contains(err.Error(), "another kubectl k8s-event run") {
		t.Errorf("install while another run renews its lease: %v, want it refused", err)
	}
}

// A Lease nobody renews is taken over once it has stayed unchanged for
// its duration on this machine's clock, even when the clock of the
// machine that wrote it runs ahead.
func TestLeaseOfAKilledRunIsTakenOverAfterItsDuration(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap(), otherRunsLease(time.Hour))
	start := time.Now()
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatalf("install after a killed run: %v", err)
	}
	if took := time.Since(start); took < leaseTimes.duration {
		t.Errorf("the lease was taken over after %v, before its duration %v", took, leaseTimes.duration)
	}
}
