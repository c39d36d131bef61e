// Command kubectl-k8s_event adds k8s_event to the CoreDNS a cluster runs,
// and takes it out again. Installed as kubectl-coredns_k8s_event (krew's
// plugin coredns-k8s-event, or `make plugin`), kubectl runs it as
// `kubectl coredns-k8s-event` (see docs/release.md for the name):
//
//	kubectl coredns-k8s-event install --image IMAGE [--dry-run]
//	kubectl coredns-k8s-event uninstall [--dry-run]
//	kubectl coredns-k8s-event status
//	kubectl coredns-k8s-event version
//
// It changes only what k8s_event needs (see internal/install) and waits
// until the Deployment has rolled out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dnsops/k8s_event/internal/install"
)

const usage = `Usage: kubectl coredns-k8s-event install|uninstall|status|version [flags]

  install     run the CoreDNS Deployment with k8s_event: its image, the
              downward-API variables, its Corefile with kubeapi and k8s_event
              (a ConfigMap of its own, named by its content), and a Role and
              RoleBinding for its ServiceAccount to create and patch events;
              a priority level of their own for its event writes at the API
              server (--flowcontrol=false: none); for many replicas, the
              fleet option and the Role that lets it count them (--fleet=false:
              none)
  uninstall   give back the image, variables and Corefile reference it had,
              remove the Roles, RoleBindings, FlowSchema and priority level
              install made
  status      say whether k8s_event is installed, and what keeps it from
              working
  version     print the version of this program

Run install again after editing your Corefile's ConfigMap: the pods roll to
the new one.

Exit status: 0 done (status: installed, no problem); 1 failed; 2 bad
usage; 3 status: not installed; 4 status: installed with problems, partly
undone, or installed by other means; 5 refused (another owner, a lease of
another run, keys another controller keeps current; --force goes on where
it can), nothing changed.

Flags:
`

// levels is a repeatable flag.
type lines []string

func (l *lines) String() string     { return strings.Join(*l, ", ") }
func (l *lines) Set(v string) error { *l = append(*l, v); return nil }

// Exit codes.
const (
	exitFailed       = 1
	exitUsage        = 2
	exitNotInstalled = 3
	exitProblems     = 4
	exitRefused      = 5
)

// exitError carries an exit code other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode says err, when there is something to say, and returns its code.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	code := exitFailed
	var e *exitError
	switch {
	case errors.As(err, &e):
		code = e.code
	case install.IsRefused(err):
		code = exitRefused
	case errors.Is(err, install.ErrNoImage):
		code = exitUsage
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(stderr, name+":", msg)
	}
	return code
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var o install.Options
	var kubeconfig, kubecontext string
	var options lines
	fs.StringVar(&kubeconfig, "kubeconfig", "", "the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&kubecontext, "context", "", "the kubeconfig context")
	fs.StringVar(&o.Namespace, "namespace", "kube-system", "the namespace of CoreDNS")
	fs.StringVar(&o.Namespace, "n", "kube-system", "short for --namespace")
	var workload string
	fs.StringVar(&workload, "workload", "", "what runs CoreDNS, as KIND/NAME: deployment/NAME or daemonset/NAME (a DaemonSet rolls a canary first, then batch by batch) (default: the Deployment labelled k8s-app=kube-dns or app.kubernetes.io/name=coredns)")
	fs.StringVar(&o.Deployment, "deployment", "", "the CoreDNS Deployment: --workload deployment/NAME")
	fs.StringVar(&o.Container, "container", "", "the CoreDNS container (default: coredns, or the only one)")
	fs.StringVar(&o.Image, "image", "", "install: the CoreDNS image with k8s_event, on the CoreDNS release the Deployment runs (when not given, install names that release and how to build its image)")
	fs.Var(&options, "option", "install: a line of the k8s_event block, e.g. 'level info warning error' (repeatable; default: none, the plugin's defaults)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print what would change, change nothing")
	fs.DurationVar(&o.Wait, "timeout", 5*time.Minute, "how long to wait for the rollout before putting back what was changed (0: do not wait)")
	fs.DurationVar(&o.Settle, "settle", 20*time.Second, "how long the new pods must stay Ready without a restart before the rollout counts as done (the Deployment's minReadySeconds when longer)")
	fs.BoolVar(&o.Force, "force", false, "go on where another owner keeps CoreDNS (helm, Argo CD, Flux, k3s, a server-side applier; not a refused layout), where the Corefile's ConfigMap has keys another controller rewrites, where --timeout 0 could take Ready pods below their count, or where --image runs another CoreDNS release")
	flowControl, fleet := true, true
	fs.BoolVar(&flowControl, "flowcontrol", true, "install: give CoreDNS's event writes a priority level of their own at the API server (a FlowSchema and a PriorityLevelConfiguration, cluster-scoped; needs flowcontrol.apiserver.k8s.io/v1); --flowcontrol=false leaves them out")
	fs.BoolVar(&fleet, "fleet", true, fmt.Sprintf("install: for a DaemonSet or a Deployment of more than %d replicas, add 'fleet %s %d' to the k8s_event block (a Corefile's own fleet line is kept) and let the ServiceAccount get its workload; --fleet=false leaves it out", install.FleetThreshold, install.FleetQPS, install.FleetBurst))
	var output string
	fs.StringVar(&output, "o", "", "output format: json (default: text)")
	fs.StringVar(&output, "output", "", "output format: json (default: text)")

	usageErr := func(err error) error { return &exitError{exitUsage, err} }
	if len(args) > 0 && args[0] == "version" {
		return printVersion(args[1:], stdout, usageErr)
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs.Usage()
		return usageErr(errors.New("name a command: install, uninstall, status or version"))
	}
	cmd := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("%s: unexpected arguments %q", cmd, fs.Args()))
	}
	if err := setWorkload(&o, workload); err != nil {
		return usageErr(err)
	}
	if o.Settle < 0 {
		return usageErr(fmt.Errorf("--settle %v: must not be negative", o.Settle))
	}
	if o.Wait < 0 {
		return usageErr(fmt.Errorf("--timeout %v: must not be negative", o.Wait))
	}
	switch output {
	case "":
	case "json":
		o.JSON = true
	default:
		return usageErr(fmt.Errorf("-o %q: want json", output))
	}
	o.Options = options
	o.NoFlowControl, o.NoFleet = !flowControl, !fleet
	o.Out = stdout
	switch cmd {
	case "install", "status":
	case "uninstall":
		if o.Image != "" || len(options) > 0 {
			return usageErr(errors.New("uninstall: --image and --option are for install"))
		}
	default:
		fs.Usage()
		return usageErr(fmt.Errorf("unknown command %q: want install, uninstall, status or version", cmd))
	}
	return dispatch(ctx, cmd, kubeconfig, kubecontext, o)
}

// setWorkload sets o's workload from --workload KIND/NAME, which
// --deployment NAME must not contradict.
func setWorkload(o *install.Options, workload string) error {
	if workload == "" {
		return nil
	}
	kind, name, ok := strings.Cut(workload, "/")
	if !ok || name == "" {
		return fmt.Errorf("--workload %q: want KIND/NAME, such as deployment/coredns", workload)
	}
	switch strings.ToLower(kind) {
	case "deployment", "deployments", "deploy":
		kind = "Deployment"
	case "daemonset", "daemonsets", "ds":
		kind = "DaemonSet"
	default:
		return fmt.Errorf("--workload %q: kind %q: want deployment or daemonset", workload, kind)
	}
	if o.Deployment != "" && (o.Deployment != name || kind != "Deployment") {
		return fmt.Errorf("--workload %q and --deployment %q name different workloads: give one", workload, o.Deployment)
	}
	o.Kind, o.Deployment = kind, name
	return nil
}

// dispatch runs cmd against the cluster that kubeconfig and kubecontext
// name.
func dispatch(ctx context.Context, cmd, kubeconfig, kubecontext string, o install.Options) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	switch cmd {
	case "install":
		return install.Install(ctx, client, o)
	case "uninstall":
		return install.Uninstall(ctx, client, o)
	case "status":
		s, err := install.Status(ctx, client, o)
		switch {
		case err != nil:
			return err
		case s.State == install.StateNotInstalled:
			return &exitError{code: exitNotInstalled}
		case !s.Healthy():
			return &exitError{code: exitProblems}
		}
	}
	return nil
}
