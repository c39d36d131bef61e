package image

import "testing"

func TestParseReference(t *testing.T) {
	for _, c := range []struct {
		ref  string
		want Reference
	}{
		{"registry.k8s.io/coredns/coredns:v1.13.1", Reference{Name: "registry.k8s.io/coredns/coredns", Tag: "v1.13.1"}},
		{"coredns/coredns", Reference{Name: "coredns/coredns"}},
		{"localhost:5000/coredns-k8s-event", Reference{Name: "localhost:5000/coredns-k8s-event"}},
		{"localhost:5000/coredns-k8s-event:1.13.1-0.2.0", Reference{Name: "localhost:5000/coredns-k8s-event", Tag: "1.13.1-0.2.0"}},
		{"coredns/coredns:1.13.1@sha256:abc", Reference{Name: "coredns/coredns", Tag: "1.13.1", Digest: "sha256:abc"}},
		{"coredns/coredns@sha256:abc", Reference{Name: "coredns/coredns", Digest: "sha256:abc"}},
	} {
		if got := ParseReference(c.ref); got != c.want {
			t.Errorf("ParseReference(%q) = %+v, want %+v", c.ref, got, c.want)
		}
	}
}

func TestCoreDNSVersion(t *testing.T) {
	for _, c := range []struct {
		ref  string
		want string // empty: not ok
	}{
		{"registry.k8s.io/coredns/coredns:v1.13.1", "1.13.1"},
		{"registry.k8s.io/coredns/coredns:v1.11.3", "1.11.3"},
		{"coredns/coredns:1.12.0", "1.12.0"},
		{"602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/coredns:v1.11.3-eksbuild.1", "1.11.3"},
		{"localhost/coredns-k8s-event:1.13.1-0.2.0-3f2a9c01d4e5", "1.13.1"},
		{"localhost:5000/coredns-k8s-event:1.15.0-0.2.0", "1.15.0"},
		{"registry.k8s.io/coredns/coredns:v1.13.1@sha256:0123", "1.13.1"},
		{"registry.k8s.io/coredns/coredns@sha256:0123", ""},
		{"coredns/coredns:latest", ""},
		{"coredns/coredns", ""},
		{"localhost:5000/coredns", ""},
		{"coredns/coredns:1.13", ""},
	} {
		v, ok := CoreDNSVersion(c.ref)
		if got := map[bool]string{true: v.String()}[ok]; got != c.want {
			t.Errorf("CoreDNSVersion(%q) = %q (ok %v), want %q", c.ref, v, ok, c.want)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for _, s := range []string{"1.13.1", "v1.13.1"} {
		if v, err := ParseVersion(s); err != nil || v != (Version{1, 13, 1}) {
			t.Errorf("ParseVersion(%q) = %v, %v", s, v, err)
		}
	}
	for _, s := range []string{"", "1.13", "1.13.1-rc1", "latest", "x1.13.1"} {
		if _, err := ParseVersion(s); err == nil {
			t.Errorf("ParseVersion(%q): no error", s)
		}
	}
	if !(Version{1, 9, 9}).Less(Version{1, 13, 1}) || (Version{1, 13, 1}).Less(Version{1, 13, 1}) || !(Version{1, 13, 1}).Less(Version{2, 0, 0}) {
		t.Error("Less orders releases wrongly")
	}
}

func TestForCoreDNS(t *testing.T) {
	ref, v, ok := ForCoreDNS("localhost/coredns-k8s-event", "0.2.0", "registry.k8s.io/coredns/coredns:v1.13.1")
	if !ok || ref != "localhost/coredns-k8s-event:1.13.1-0.2.0" || v != (Version{1, 13, 1}) {
		t.Errorf("ForCoreDNS = %q %v %v", ref, v, ok)
	}
	// Already k8s_event: the same release again.
	ref, _, ok = ForCoreDNS("r.example/k", "v0.3.0", "localhost/coredns-k8s-event:1.12.0-0.2.0-3f2a9c01d4e5")
	if !ok || ref != "r.example/k:1.12.0-0.3.0" {
		t.Errorf("ForCoreDNS over k8s_event = %q %v", ref, ok)
	}
	if _, _, ok := ForCoreDNS("r.example/k", "0.2.0", "coredns/coredns@sha256:0123"); ok {
		t.Error("ForCoreDNS guessed a release from a digest")
	}
}

func TestSameCoreDNS(t *testing.T) {
	for _, c := range []struct {
		running, image string
		same           bool
		change         string
	}{
		{"registry.k8s.io/coredns/coredns:v1.13.1", "localhost/coredns-k8s-event:1.13.1-0.2.0-3f2a9c01d4e5", true, "CoreDNS 1.13.1 -> 1.13.1"},
		{"registry.k8s.io/coredns/coredns:v1.13.1", "localhost/coredns-k8s-event:1.15.0-0.2.0-3f2a9c01d4e5", false, "CoreDNS 1.13.1 -> 1.15.0"},
		{"registry.k8s.io/coredns/coredns@sha256:0123", "localhost/coredns-k8s-event:1.15.0-0.2.0", false, "CoreDNS unknown -> 1.15.0"},
		{"registry.k8s.io/coredns/coredns:v1.13.1", "mine/coredns:latest", false, "CoreDNS 1.13.1 -> unknown"},
	} {
		same, change := SameCoreDNS(c.running, c.image)
		if same != c.same || change != c.change {
			t.Errorf("SameCoreDNS(%q, %q) = %v %q, want %v %q", c.running, c.image, same, change, c.same, c.change)
		}
	}
}
