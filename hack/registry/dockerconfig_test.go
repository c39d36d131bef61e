package main

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With DOCKER_CONFIG set, the default keychain reads $DOCKER_CONFIG/config.json
// (as docker does), even when ~/.docker/config.json exists. The error for rejected
// credentials must name the file they came from.
func TestRejectedCredentialsNameTheConfigTheyCameFrom(t *testing.T) {
	a := testArchives(t)
	host := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "pusher" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	write := func(dir, user, pw string) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pw))
		cfg := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_CONFIG_HOME", "")
	write(filepath.Join(home, ".docker"), "pusher", "s3cret") // good, but not used
	dc := filepath.Join(t.TempDir(), "ci-docker")
	t.Setenv("DOCKER_CONFIG", dc)
	write(dc, "ciuser", "wrong") // what the keychain actually reads

	_, err := pushCmd(t, "-archive", a[0], host+"/coredns-k8s-event:v1")
	if err == nil {
		t.Fatal("push succeeded")
	}
	want := filepath.Join(dc, "config.json")
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error:\n  %v\nsays to fix an entry in a file other than the one the credentials (user ciuser) came from, %s", err, want)
	}
}
