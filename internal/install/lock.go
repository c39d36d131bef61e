package install

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// leaseTiming is how long a run's Lease lasts unrenewed, how often the
// run renews it, and how often another run looks whether it has.
type leaseTiming struct {
	duration, renew, poll time.Duration
}

// leaseTimes are the Lease's times: a run killed (SIGKILL, a CI job
// cancelled) stops renewing, and the next run takes its Lease over once it
// has seen it unchanged for its duration.
var leaseTimes = leaseTiming{duration: 30 * time.Second, renew: 10 * time.Second, poll: time.Second}

// maxObserve is the longest Lease duration a run waits out: a Lease that
// asks for longer is refused at once, with what to do.
const maxObserve = 2 * time.Minute

// lock takes the Lease named for the Deployment, so that two runs of
// install or uninstall never interleave: one's prune could delete the
// Corefile another has just made. The run renews it until it calls the
// function lock returns, which gives it back. A Lease of another run is
// judged as leader election judges it: by whether it changes while this
// run watches it, on this run's own clock, never by its renewTime, which
// another machine's clock wrote. One renewed meanwhile is refused; one
// left unchanged for its whole duration is a dead run's, and taken over.
func lock(ctx context.Context, c kubernetes.Interface, ns, deployment string) (func(), error) {
	leases := c.CoordinationV1().Leases(ns)
	name := deployment + "-k8s-event"
	want := newLease(ns, name, deployment)
	got, err := leases.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		got, err = takeOver(ctx, leases, name, want)
	}
	if err != nil {
		if IsRefused(err) {
			return nil, err
		}
		return nil, fmt.Errorf("lease %s/%s: %w", ns, name, err)
	}
	h := &held{leases: leases, lease: got, stop: make(chan struct{})}
	h.wg.Add(1)
	go h.renewLoop(ctx)
	return h.release, nil
}

func newLease(ns, name, deployment string) *coordinationv1.Lease {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	secs := int32(leaseTimes.duration / time.Second)
	if secs < 1 {
		secs = 1
	}
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{DeploymentLabel: deployment, managedByLabel: FieldManager}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
	}
}

// takeOver watches the Lease another run holds: refused as soon as it
// changes, taken over once it has stayed as it was for its duration, as
// this process's clock measures it.
func takeOver(ctx context.Context, leases coordinationclient.LeaseInterface, name string, want *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	first, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return leases.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	}
	if err != nil {
		return nil, err
	}
	d := leaseDuration(first)
	if d > maxObserve {
		return nil, &RefusedError{[]string{heldBy(first)}}
	}
	seen := time.Now()
	err = wait.PollUntilContextCancel(ctx, leaseTimes.poll, false, func(ctx context.Context) (bool, error) {
		now, err := leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return false, &RefusedError{[]string{heldBy(first) + " (it has just given it back: run again)"}}
		case err != nil:
			return false, nil
		case !sameLease(first, now):
			return false, &RefusedError{[]string{heldBy(now)}}
		}
		return time.Since(seen) >= d, nil
	})
	if err != nil {
		return nil, err
	}
	have := first.DeepCopy()
	have.Spec = want.Spec
	got, err := leases.Update(ctx, have, metav1.UpdateOptions{FieldManager: FieldManager})
	if apierrors.IsConflict(err) {
		// Renewed, or taken over by a third run, at the last moment.
		return nil, &RefusedError{[]string{heldBy(first)}}
	}
	return got, err
}

// sameLease reports whether b is a as it was: the same holder, not
// renewed, not rewritten.
func sameLease(a, b *coordinationv1.Lease) bool {
	return a.UID == b.UID && a.ResourceVersion == b.ResourceVersion && equalJSON(a.Spec, b.Spec)
}

func leaseDuration(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// held is a Lease this run holds, and renews.
type held struct {
	leases coordinationclient.LeaseInterface
	mu     sync.Mutex
	lease  *coordinationv1.Lease
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// renewLoop renews the Lease until release, even when the run's context
// is done: an interrupted run still puts back what it changed.
func (h *held) renewLoop(ctx context.Context) {
	defer h.wg.Done()
	ctx = context.WithoutCancel(ctx)
	t := time.NewTicker(leaseTimes.renew)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		l := h.lease.DeepCopy()
		h.mu.Unlock()
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		rctx, cancel := context.WithTimeout(ctx, leaseTimes.renew)
		got, err := h.leases.Update(rctx, l, metav1.UpdateOptions{FieldManager: FieldManager})
		cancel()
		if err == nil {
			h.mu.Lock()
			h.lease = got
			h.mu.Unlock()
		}
	}
}

// release stops the renewal and deletes the Lease as this run left it: a
// run that took it over after it expired changed its resourceVersion.
func (h *held) release() {
	h.once.Do(func() {
		close(h.stop)
		h.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.mu.Lock()
		l := h.lease
		h.mu.Unlock()
		pre := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{}}
		if l.UID != "" {
			pre.Preconditions.UID = ptrTo(types.UID(l.UID))
		}
		if l.ResourceVersion != "" {
			pre.Preconditions.ResourceVersion = &l.ResourceVersion
		}
		_ = h.leases.Delete(ctx, l.Name, pre)
	})
}

// leaseHeld says which other run holds the Lease of the Deployment, or ""
// when none does: what a dry run and status report, as they take no
// Lease. Whether that run still lives only watching the Lease tells: a
// real run would wait up to its duration to see.
func leaseHeld(ctx context.Context, c kubernetes.Interface, ns, deployment string) string {
	l, err := c.CoordinationV1().Leases(ns).Get(ctx, deployment+"-k8s-event", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return heldBy(l)
}

// heldBy describes the run that holds l, and what to do.
func heldBy(l *coordinationv1.Lease) string {
	holder, since, renewed := "", "", ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.AcquireTime != nil {
		since = l.Spec.AcquireTime.UTC().Format(time.RFC3339)
	}
	if l.Spec.RenewTime != nil {
		renewed = l.Spec.RenewTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("another kubectl k8s-event run (%s) holds lease %s/%s since %s, renewed at %s by its clock, for %v at a time: wait for it to end; a run takes it over once it has stayed unrenewed that long; if none runs, kubectl -n %s delete lease %s", holder, l.Namespace, l.Name, since, renewed, leaseDuration(l), l.Namespace, l.Name)
}

func ptrTo[T any](v T) *T { return &v }
