package install

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// An image on another CoreDNS release than the one the Deployment runs
// would upgrade (or downgrade) CoreDNS with the install: refused, with the
// release of each and how to build the right one, unless --force; the dry
// run and the run name both releases.
func TestInstallRefusesAnotherCoreDNSRelease(t *testing.T) {
	ctx := context.Background()
	newer := "registry.example/coredns-k8s-event:1.15.0-0.2.0-abc"
	c := newClient(deployment(), configMap())
	var out bytes.Buffer
	err := Install(ctx, c, Options{Image: newer, Out: &out})
	if !IsRefused(err) {
		t.Fatalf("install of an image on CoreDNS 1.15.0 into 1.13.1: %v, want refused", err)
	}
	for _, want := range []string{"runs CoreDNS 1.15.0", "CoreDNS 1.13.1 -> 1.15.0", "make image COREDNS_VERSION=1.13.1", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q:\n%v", want, err)
		}
	}
	if ctr := get(t, c).Spec.Template.Spec.Containers[0]; ctr.Image != deployment().Spec.Template.Spec.Containers[0].Image {
		t.Errorf("the refused install changed the image to %s", ctr.Image)
	}
	out.Reset()
	if err := Install(ctx, c, Options{Image: newer, Force: true, DryRun: true, Out: &out}); err != nil {
		t.Fatalf("--force --dry-run: %v", err)
	}
	if !strings.Contains(out.String(), "(CoreDNS 1.13.1 -> 1.15.0)") {
		t.Errorf("the dry run does not name the releases:\n%s", out.String())
	}
}

// An image whose tag names no release (a digest, latest) cannot be
// checked: the install goes on, says so, and calls the release unknown.
func TestInstallWarnsOfUnknownRelease(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	var out bytes.Buffer
	if err := Install(ctx, c, Options{Image: "registry.example/coredns-k8s-event@sha256:0123", DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(CoreDNS 1.13.1 -> unknown)", "whose tag does not name its CoreDNS release"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the dry run does not say %q:\n%s", want, out.String())
		}
	}
}

// status names the release the pods run, and the one they ran before the
// install.
func TestStatusNamesCoreDNSReleases(t *testing.T) {
	ctx := context.Background()
	c := newClient(deployment(), configMap())
	if err := Install(ctx, c, Options{Image: image}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := Status(ctx, c, Options{Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if s.CoreDNS != "1.13.1" || s.BeforeCoreDNS != "1.13.1" {
		t.Errorf("status: CoreDNS %q, before %q", s.CoreDNS, s.BeforeCoreDNS)
	}
	for _, want := range []string{"image " + image + " (CoreDNS 1.13.1)", "before the install: image registry.k8s.io/coredns/coredns:v1.13.1 (CoreDNS 1.13.1)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status does not say %q:\n%s", want, out.String())
		}
	}
}
