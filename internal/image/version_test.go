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
