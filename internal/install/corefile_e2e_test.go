//go:build e2e

package install

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dnsops/k8s_event/internal/cluster"
)

// Every Corefile that install makes of the corpus starts a real CoreDNS
// built with kubeapi and k8s_event (test/cmd/coredns), against a real
// kube-apiserver. To run here, the result is made local by the same byte
// edits install makes (ports, the test's kubeconfig, loopback addresses,
// no loop); nothing else of it changes.
func TestAddPluginsResultsStartCoreDNS(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bin := buildCoreDNS(ctx, t)
	kube, err := cluster.New(ctx, cluster.Options{})
	if err != nil {
		t.Fatalf("start the control plane: %v", err)
	}
	defer kube.Stop()
	for name, src := range corpus(t) {
		if strings.HasPrefix(name, "refused") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			out, _, err := AddPlugins(src, corpusOptions[name])
			if err != nil {
				t.Fatal(err)
			}
			port, err := cluster.FreeDNSPort()
			if err != nil {
				t.Fatal(err)
			}
			if refused := refusedAsWritten[name]; refused != nil {
				// install refuses it, as CoreDNS refuses the original.
				local, err := localCorefile(src, port, kube.KubeconfigPath)
				if err != nil {
					t.Fatal(err)
				}
				plugin := strings.Fields(strings.SplitN(refused.Error(), "the block of ", 2)[1])[0]
				failsToStart(t, bin, local, port, "plugin/"+plugin+":")
				return
			}
			local, err := localCorefile(out, port, kube.KubeconfigPath)
			if err != nil {
				t.Fatal(err)
			}
			startsCoreDNS(t, bin, local, port)
		})
	}
}

// buildCoreDNS builds test/cmd/coredns, as the other end-to-end tests do.
func buildCoreDNS(ctx context.Context, t *testing.T) string {
	t.Helper()
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("find the module root: %v", err)
	}
	bin := t.TempDir() + "/coredns"
	build := exec.CommandContext(ctx, "go", "build", "-race", "-o", bin, "./test/cmd/coredns")
	build.Dir = strings.TrimSpace(string(root))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build test/cmd/coredns: %v\n%s", err, out)
	}
	return bin
}

// startsCoreDNS runs CoreDNS on corefile and fails t unless it answers on
// port (TCP) and has logged no error by then.
func startsCoreDNS(t *testing.T, bin, corefile string, port int) {
	t.Helper()
	p, up := runCoreDNS(t, bin, corefile, port)
	defer p.Stop(15 * time.Second)
	if !up {
		t.Fatalf("coredns did not start (exit code %d):\n%s\n--- Corefile ---\n%s", p.ExitCode(), p.LogTail(30), corefile)
	}
	if p.LogContains("[ERROR]") || p.LogContains("panic: ") {
		t.Errorf("coredns logged an error:\n%s\n--- Corefile ---\n%s", p.LogTail(30), corefile)
	}
}

// failsToStart runs CoreDNS on corefile and fails t unless it exits
// without answering, having logged want.
func failsToStart(t *testing.T, bin, corefile string, port int, want string) {
	t.Helper()
	p, up := runCoreDNS(t, bin, corefile, port)
	defer p.Stop(15 * time.Second)
	if up || !p.LogContains(want) {
		t.Fatalf("coredns answers %v, log without %q:\n%s\n--- Corefile ---\n%s", up, want, p.LogTail(30), corefile)
	}
}

// runCoreDNS starts CoreDNS on corefile and waits until it answers on
// port (TCP), true, or exits, false.
func runCoreDNS(t *testing.T, bin, corefile string, port int) (*cluster.Process, bool) {
	t.Helper()
	dir := t.TempDir()
	conf := dir + "/Corefile"
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"COREDNS_POD_NAME=coredns-corpus", "COREDNS_NAMESPACE=default", "COREDNS_POD_UID=00000000-0000-0000-0000-000000000001", "COREDNS_NODE_NAME=node-e2e"}
	p, err := cluster.StartProcess("coredns", dir+"/coredns.log", env, bin, "-conf", conf)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if p.Exited() {
			return p, false
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return p, true
		}
	}
	return p, false
}

// withPort is a server block's key with port for its own.
func withPort(key string, port int) string {
	if i := strings.LastIndexByte(key, ':'); i >= 0 && strings.Trim(key[i+1:], "0123456789") == "" {
		key = key[:i]
	}
	return key + ":" + strconv.Itoa(port)
}

// localCorefile is corefile made to run here: every server block on
// port, kubernetes and kubeapi with kubeconfig, health, ready and
// prometheus on free loopback ports, forward to a loopback port where
// nothing listens, and no loop (it queries upstream at start).
func localCorefile(corefile string, port int, kubeconfig string) (string, error) {
	c, err := readCorefile(corefile, nil)
	if err != nil {
		return "", err
	}
	var splices []splice
	for i := range c.blocks {
		b := &c.blocks[i]
		if isSnippet(b.keys) {
			if b.stanzas, err = c.stanzasBetween(b.open+1, b.close); err != nil {
				return "", err
			}
		} else {
			for k := b.open - len(b.keys); k < b.open; k++ {
				t := c.tokens[k]
				splices = append(splices, splice{t.start, t.end, withPort(c.src[t.start:t.end], port)})
			}
		}
		for _, s := range b.stanzas {
			more, err := c.localStanza(s, kubeconfig)
			if err != nil {
				return "", err
			}
			splices = append(splices, more...)
		}
	}
	return applySplices(corefile, splices), nil
}

// stanzasBetween reads the directives of tokens [from, to).
func (c *corefileText) stanzasBetween(from, to int) ([]stanza, error) {
	var stanzas []stanza
	for i := from; i < to; {
		end, err := c.stanzaEnd(i)
		if err != nil {
			return nil, err
		}
		end = min(end, to)
		stanzas = append(stanzas, stanza{i, end})
		i = end
	}
	return stanzas, nil
}

// localStanza is the splices that make stanza s run here.
func (c *corefileText) localStanza(s stanza, kubeconfig string) ([]splice, error) {
	name := c.tokens[s.first]
	free := func() (string, error) {
		p, err := cluster.FreePort()
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), err
	}
	// args are the stanza's arguments: the tokens on its first line
	// before any {.
	args := stanza{s.first + 1, s.first + 1}
	for args.end < s.end && !startsLine(c.tokens, args.end) && c.tokens[args.end].text != "{" {
		args.end++
	}
	switch name.text {
	case "kubernetes", "kubeapi":
		// On a line of its own after the {, so that a block that closes
		// on its option's line stays as it is.
		line := "kubeconfig " + kubeconfig
		for o := s.first + 1; o < s.end; o++ {
			if c.tokens[o].text == "{" {
				indent := c.indentOf(s.first) + c.unit
				return []splice{{c.tokens[o].end, c.tokens[o].end, c.newline + indent + line + c.newline + indent}}, nil
			}
		}
		return c.setStanzaOptions(s, []string{line})
	case "loop":
		return []splice{{name.start, c.tokens[s.end-1].end, ""}}, nil
	case "forward":
		if args.end-args.first < 2 {
			return nil, errors.New("Corefile:" + strconv.Itoa(name.line) + ": forward without a destination")
		}
		addr, err := free()
		return []splice{{c.tokens[args.first+1].start, c.tokens[args.end-1].end, addr}}, err
	case "health", "ready", "prometheus":
		addr, err := free()
		if args.end > args.first {
			return []splice{{c.tokens[args.first].start, c.tokens[args.end-1].end, addr}}, err
		}
		return []splice{{name.end, name.end, " " + addr}}, err
	}
	return nil, nil
}
