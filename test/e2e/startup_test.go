//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// TestStartupErrors runs CoreDNS with Corefiles that must not start: it exits
// non-zero and says what is wrong, naming the option and the value.
func TestStartupErrors(t *testing.T) {
	pod := testPod(t)
	for _, tc := range []struct {
		name, stanza string
		want         []string
	}{
		{"no kubeapi", "k8s_event", []string{"kubeapi plugin must be enabled in the same server block"}},
		{"zero QPS", "kubeapi {\n kubeconfig " + kube.KubeconfigPath + "\n}\nk8s_event {\n rate 0\n}", []string{"rate QPS", ": 0"}},
		{"unknown level", "kubeapi {\n kubeconfig " + kube.KubeconfigPath + "\n}\nk8s_event {\n level verbose\n}", []string{"level", `"verbose"`}},
		{"unknown property", "kubeapi {\n kubeconfig " + kube.KubeconfigPath + "\n}\nk8s_event {\n burst 3\n}", []string{"unknown property", `"burst"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			port, err := cluster.FreeDNSPort()
			if err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(dir, "Corefile")
			corefile := ".:" + strconv.Itoa(port) + " {\n" + tc.stanza + "\nwhoami\n}\n"
			if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := cluster.StartProcess("coredns", filepath.Join(dir, "coredns.log"), podEnv(pod), corednsBin, "-conf", conf)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Stop(5 * time.Second) })
			_ = p.Wait(timeout) // an exit status other than 0 is what we want
			if !p.Exited() {
				t.Fatalf("CoreDNS did not exit:\n%s", p.LogTail(20))
			}
			if p.ExitCode() == 0 {
				t.Errorf("exit code 0 for %q", corefile)
			}
			for _, w := range tc.want {
				if !strings.Contains(p.Log(), w) {
					t.Errorf("log lacks %q:\n%s", w, p.LogTail(20))
				}
			}
		})
	}
}
