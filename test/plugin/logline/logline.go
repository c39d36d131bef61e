// Package logline is a test plugin that makes CoreDNS log on demand.
//
//	logline [ADDR]
//
// A query for a name under fail.logline. gets SERVFAIL and an error that the
// errors plugin logs. With ADDR, an HTTP server there takes
// POST /log?level=LEVEL&count=N and logs the request body N times at LEVEL
// through a plugin logger, verbatim: its own, or with plugin=NAME, the one
// CoreDNS gives plugin NAME (clog.NewWithPlugin), as if NAME had logged.
package logline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/miekg/dns"
)

const name = "logline"

var log = clog.NewWithPlugin(name)

// errInjected is what a fail.logline. query returns.
var errInjected = errors.New("logline: injected failure")

func init() { plugin.Register(name, setup) }

func setup(c *caddy.Controller) error {
	c.Next()
	args := c.RemainingArgs()
	if len(args) > 1 {
		return plugin.Error(name, c.ArgErr())
	}
	if len(args) == 1 {
		srv := &server{addr: args[0]}
		// As the health plugin does: the new instance starts up before the
		// old one shuts down, so the port is freed before a reload.
		c.OnStartup(srv.start)
		c.OnRestart(srv.stop)
		c.OnRestartFailed(srv.start)
		c.OnFinalShutdown(srv.stop)
	}
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler { return handler{next} })
	return nil
}

type handler struct{ next plugin.Handler }

func (h handler) Name() string { return name }

func (h handler) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if len(r.Question) == 1 && dns.IsSubDomain("fail.logline.", strings.ToLower(r.Question[0].Name)) {
		return dns.RcodeServerFailure, errInjected
	}
	return plugin.NextOrFailure(name, h.next, ctx, w, r)
}

type server struct {
	addr string
	ln   net.Listener
}

func (s *server) start() error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	s.ln = ln
	go http.Serve(ln, http.HandlerFunc(serveLog))
	return nil
}

func (s *server) stop() error {
	if s.ln != nil {
		return s.ln.Close()
	}
	return nil
}

func serveLog(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/log" {
		http.Error(w, "POST /log?level=LEVEL&count=N", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	count := 1
	if c := r.URL.Query().Get("count"); c != "" {
		if count, err = strconv.Atoi(c); err != nil || count < 1 {
			http.Error(w, "bad count", http.StatusBadRequest)
			return
		}
	}
	msg := string(body)
	logger := log
	if p := r.URL.Query().Get("plugin"); p != "" {
		logger = clog.NewWithPlugin(p)
	}
	var logf func(...any)
	switch r.URL.Query().Get("level") {
	case "debug":
		logf = logger.Debug
	case "info":
		logf = logger.Info
	case "warning":
		logf = logger.Warning
	case "error", "":
		logf = logger.Error
	case "fatal":
		logf = logger.Fatal
	default:
		http.Error(w, "bad level", http.StatusBadRequest)
		return
	}
	for range count {
		logf(msg)
	}
	w.WriteHeader(http.StatusOK)
}

// Post asks the logline server at addr to log body count times at level.
func Post(ctx context.Context, addr, level string, count int, body string) error {
	return PostAs(ctx, addr, "", level, count, body)
}

// PostAs is Post through the logger of plugin; "" is logline's own.
func PostAs(ctx context.Context, addr, plugin, level string, count int, body string) error {
	q := url.Values{"level": {level}, "count": {strconv.Itoa(count)}}
	if plugin != "" {
		q.Set("plugin", plugin)
	}
	u := url.URL{Scheme: "http", Host: addr, Path: "/log", RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", u.String(), resp.Status)
	}
	return nil
}
