package install

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// lock takes the Lease named for the Deployment, so that two runs of
// install or uninstall never interleave: one's prune could delete the
// Corefile another has just made. It returns the function that gives the
// Lease back. A Lease past its duration (a run that was killed) is taken
// over.
func lock(ctx context.Context, c kubernetes.Interface, ns, deployment string, hold time.Duration) (func(), error) {
	leases := c.CoordinationV1().Leases(ns)
	name := deployment + "-k8s-event"
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	secs := int32(hold / time.Second)
	now := metav1.NewMicroTime(time.Now())
	want := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{DeploymentLabel: deployment, managedByLabel: FieldManager}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
	}
	got, err := leases.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		have, gerr := leases.Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("lease %s/%s: %w", ns, name, gerr)
		}
		if !expired(have) {
			return nil, &RefusedError{[]string{heldBy(have)}}
		}
		have.Spec = want.Spec
		got, err = leases.Update(ctx, have, metav1.UpdateOptions{FieldManager: FieldManager})
	}
	if err != nil {
		return nil, fmt.Errorf("lease %s/%s: %w", ns, name, err)
	}
	uid, rv := got.UID, got.ResourceVersion
	return func() {
		// The run's own context may be done (interrupted): give the lease
		// back all the same.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		// Only the Lease as this run left it: a run that took it over
		// after it expired changed its resourceVersion.
		pre := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{}}
		if uid != "" {
			pre.Preconditions.UID = ptrTo(types.UID(uid))
		}
		if rv != "" {
			pre.Preconditions.ResourceVersion = &rv
		}
		_ = leases.Delete(ctx, name, pre)
	}, nil
}

// leaseHeld says which other run holds the Lease of the Deployment, or ""
// when none does: what a dry run reports, as it takes no Lease itself.
func leaseHeld(ctx context.Context, c kubernetes.Interface, ns, deployment string) string {
	l, err := c.CoordinationV1().Leases(ns).Get(ctx, deployment+"-k8s-event", metav1.GetOptions{})
	if err != nil || expired(l) {
		return ""
	}
	return heldBy(l)
}

// heldBy describes the run that holds l, and what to do.
func heldBy(l *coordinationv1.Lease) string {
	holder, since, until := "", "", ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.AcquireTime != nil {
		since = l.Spec.AcquireTime.UTC().Format(time.RFC3339)
	}
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		until = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("another kubectl k8s-event run (%s) holds lease %s/%s since %s, until %s: wait for it to end; if none runs, kubectl -n %s delete lease %s", holder, l.Namespace, l.Name, since, until, l.Namespace, l.Name)
}

func expired(l *coordinationv1.Lease) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
}

func ptrTo[T any](v T) *T { return &v }
