//go:build e2e

package e2e

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// proxyMode is what a faultProxy does with connections.
type proxyMode int

const (
	// proxyRefuse resets every new connection at once.
	proxyRefuse proxyMode = iota
	// proxyForward passes bytes both ways.
	proxyForward
	// proxyBlackhole accepts connections and never answers.
	proxyBlackhole
)

// faultProxy is a TCP proxy on loopback in front of the API server. It can
// refuse connections, cut the ones it carries, and hold back what the server
// sends for a while. TLS passes through untouched: the API server's
// certificate is valid for 127.0.0.1 whatever the port.
type faultProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu       sync.Mutex
	mode     proxyMode
	delay    time.Duration // how long bytes from the server are held back
	conns    map[net.Conn]struct{}
	accepted int
	wake     chan struct{} // closed and replaced when delay changes
	wg       sync.WaitGroup
}

// newFaultProxy listens on a free loopback port and forwards to upstream
// (host:port) once set to proxyForward. It is closed in t's cleanup.
func newFaultProxy(t *testing.T, upstream string, mode proxyMode) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, ln: ln, upstream: upstream, mode: mode, conns: map[net.Conn]struct{}{}, wake: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case proxyRefuse:
			reset(c)
			continue
		case proxyBlackhole:
			p.mu.Lock()
			p.conns[c] = struct{}{}
			p.mu.Unlock()
			p.wg.Add(1)
			go func() { // read and drop until cut
				defer p.wg.Done()
				_, _ = io.Copy(io.Discard, c)
			}()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			reset(c)
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c, false)
		go p.pipe(c, up, true)
	}
}

// reset closes c with a TCP RST, as a port with nothing behind it would.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst; from the server (delayed) each chunk waits until
// the delay in force has passed since it arrived.
func (p *faultProxy) pipe(dst, src net.Conn, delayed bool) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		reset(dst)
		reset(src)
	}()
	if !delayed {
		_, _ = io.Copy(dst, src)
		return
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		for {
			p.mu.Lock()
			due, wake := ch.at.Add(p.delay), p.wake
			p.mu.Unlock()
			d := time.Until(due)
			if d <= 0 {
				break
			}
			timer := time.NewTimer(d)
			select {
			case <-timer.C:
			case <-wake:
			}
			timer.Stop()
		}
		if _, err := dst.Write(ch.b); err != nil {
			src.Close()
			for range chunks {
			}
			return
		}
	}
}

// setMode changes what happens to new connections.
func (p *faultProxy) setMode(m proxyMode) {
	p.mu.Lock()
	p.mode = m
	p.mu.Unlock()
}

// setDelay holds back every byte from the server for d, those in flight
// included; zero lets everything through at once.
func (p *faultProxy) setDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

// cut resets every connection the proxy carries.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		reset(c)
	}
}

// connections is the number of connections accepted so far.
func (p *faultProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.setDelay(0)
	p.cut()
	p.wg.Wait()
}

// kubeconfigVia writes a copy of the kubeconfig at path whose clusters use
// the server at addr (host:port) instead, and returns the copy's path.
func kubeconfigVia(t *testing.T, path, addr string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	out := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
