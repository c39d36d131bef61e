//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// holdProxy is an HTTPS reverse proxy in front of the API server that can
// hold single requests back: it sees each request, unlike faultProxy, which
// sees only the bytes of the one HTTP/2 connection all requests share.
type holdProxy struct {
	srv *httptest.Server
	// hold tells how long to hold a request back before passing it on;
	// one held past the client's time-out still reaches the API server.
	hold func(r *http.Request, body []byte) time.Duration
}

func newHoldProxy(t *testing.T, hold func(*http.Request, []byte) time.Duration) *holdProxy {
	t.Helper()
	rt, err := rest.TransportFor(kube.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(kube.RESTConfig.Host)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = rt
	p := &holdProxy{hold: hold}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if d := p.hold(r, body); d > 0 {
			time.Sleep(d)
			// The client gave up meanwhile: the request goes on all the
			// same, as one already on its way to etcd would.
			r = r.WithContext(context.WithoutCancel(r.Context()))
		}
		rp.ServeHTTP(w, r)
	}))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	return p
}

// kubeconfig is the admin kubeconfig, pointed at the proxy.
func (p *holdProxy) kubeconfig(t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kube.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	for _, c := range cfg.Clusters {
		c.Server, c.CertificateAuthorityData, c.CertificateAuthority = p.srv.URL, ca, ""
	}
	out := filepath.Join(t.TempDir(), "held.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// hangCorefile gives warnings a bucket of one token, refilled ten times a
// second.
const hangCorefile = `.:{{.DNS}} {
    kubeapi {
        kubeconfig {{.Kubeconfig}}
    }
    k8s_event {
        rate 10 1
    }
    errors
    logline {{.Logline}}
    prometheus {{.Metrics}}
    whoami
}
`

// TestHungCreateHoldsOnlyItsEvent holds the create of one warning past the
// write time-out (10 s): another warning becomes an event while that
// create is still held, as its bucket refills, and the held line ends as
// one object with count 1 (the create reached the API server after the
// client gave up; its retry finds it).
func TestHungCreateHoldsOnlyItsEvent(t *testing.T) {
	pod := testPod(t)
	const held, next = "the create of this line hangs", "this line goes meanwhile"
	const holdFor = 13 * time.Second
	var once sync.Once
	heldAt := make(chan time.Time, 1)
	px := newHoldProxy(t, func(r *http.Request, body []byte) time.Duration {
		var d time.Duration
		if r.Method == http.MethodPost && bytes.Contains(body, []byte(held)) {
			once.Do(func() {
				d = holdFor
				heldAt <- time.Now()
			})
		}
		return d
	})
	c := startFaults(t, pod, hangCorefile, withKubeconfig(px.kubeconfig(t)))

	c.logLine("warning", 1, held)
	var start time.Time
	select {
	case start = <-heldAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the first warning's create never reached the proxy")
	}
	logged := time.Now()
	c.logLine("warning", 1, next)
	waitEventsFor(t, pod, 8*time.Second, "the second warning's event while the first create is held", func(evs []corev1.Event) bool {
		m := withExactMessage(evs, "plugin/logline: "+next)
		return len(m) == 1 && m[0].Count == 1
	})
	landed := time.Since(logged)
	t.Logf("the second warning landed %v after it was logged, %v into the first create's hold of %v", landed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), holdFor)
	if time.Since(start) >= writeTimeoutE2E {
		t.Errorf("the second warning landed %v after the first create was held: not before that create timed out", time.Since(start))
	}

	evs := waitEventsFor(t, pod, 45*time.Second, "the held line as one object with count 1", func(evs []corev1.Event) bool {
		m := withExactMessage(evs, "plugin/logline: "+held)
		return len(m) == 1 && m[0].Count == 1
	})
	evs = settle(t, pod, 3*time.Second, "no second object of the held line", func(evs []corev1.Event) bool {
		return len(withExactMessage(evs, "plugin/logline: "+held)) == 1
	})
	t.Logf("events:\n%s", describe(evs))
}

// writeTimeoutE2E is the plugin's write time-out.
const writeTimeoutE2E = 10 * time.Second
