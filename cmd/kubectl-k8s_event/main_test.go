package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dnsops/k8s_event/internal/install"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"done", nil, 0},
		{"failed", errors.New("patch deployment: boom"), exitFailed},
		{"refused", &install.RefusedError{Reasons: []string{"helm"}}, exitRefused},
		{"not installed", &exitError{code: exitNotInstalled}, exitNotInstalled},
		{"problems", &exitError{code: exitProblems}, exitProblems},
	} {
		var stderr bytes.Buffer
		if got := exitCode(tc.err, &stderr); got != tc.want {
			t.Errorf("%s: exit %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"install", "-o", "yaml"},
		{"install", "--timeout", "-1s"},
		{"uninstall", "--image", "x"},
		{"status", "extra"},
		{"install", "--no-such-flag"},
	} {
		var out, stderr bytes.Buffer
		err := run(context.Background(), args, &out, &stderr)
		if got := exitCode(err, &stderr); got != exitUsage {
			t.Errorf("%q: exit %d (%v), want %d", args, got, err, exitUsage)
		}
	}
}

// An install without --image is a usage error: exit 2.
func TestInstallWithoutImageIsUsage(t *testing.T) {
	err := fmt.Errorf("%w: deployment kube-system/coredns runs CoreDNS 1.13.1", install.ErrNoImage)
	if code := exitCode(err, io.Discard); code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
}

// --workload KIND/NAME names what runs CoreDNS; --deployment NAME is its
// alias for a Deployment, and the two must not contradict each other.
func TestWorkloadFlag(t *testing.T) {
	for _, tc := range []struct {
		workload, deployment string
		kind, name, err      string
	}{
		{"", "coredns", "", "coredns", ""},
		{"deployment/coredns", "", "Deployment", "coredns", ""},
		{"deploy/coredns", "coredns", "Deployment", "coredns", ""},
		{"daemonset/node-local-dns", "", "DaemonSet", "node-local-dns", ""},
		{"ds/coredns", "coredns", "", "", "name different workloads"},
		{"deployment/a", "b", "", "", "name different workloads"},
		{"statefulset/coredns", "", "", "", `kind "statefulset"`},
		{"coredns", "", "", "", "want KIND/NAME"},
	} {
		o := install.Options{Deployment: tc.deployment}
		err := setWorkload(&o, tc.workload)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("--workload %q --deployment %q: %v, want %q", tc.workload, tc.deployment, err, tc.err)
		case tc.err == "" && (err != nil || o.Kind != tc.kind || o.Deployment != tc.name):
			t.Errorf("--workload %q --deployment %q: %v, kind %q name %q", tc.workload, tc.deployment, err, o.Kind, o.Deployment)
		}
	}
	var out, stderr bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"status", "--workload", "coredns"}, &out, &stderr), &stderr); code != exitUsage {
		t.Errorf("--workload without a kind: exit %d, want %d", code, exitUsage)
	}
}

// version prints the program's name as kubectl runs it and its version,
// and takes no argument.
func TestVersion(t *testing.T) {
	var out, stderr bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &stderr); err != nil {
		t.Fatalf("version: %v", err)
	}
	if got, want := out.String(), "kubectl coredns-k8s-event devel\n"; got != want {
		t.Errorf("version printed %q, want %q (a test binary has no version linked in)", got, want)
	}
	err := run(context.Background(), []string{"version", "extra"}, &out, &stderr)
	if code := exitCode(err, &stderr); code != exitUsage {
		t.Errorf("version extra: exit %d (%v), want %d", code, err, exitUsage)
	}
}

// --flowcontrol and --fleet are booleans that install takes: false turns
// the priority level or the fleet line off; anything but a boolean is a
// usage error.
func TestFlowControlAndFleetFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"install", "--image", "x", "--flowcontrol=false", "--fleet=false", "--kubeconfig", missing}, exitFailed},
		{[]string{"install", "--image", "x", "--flowcontrol", "--kubeconfig", missing}, exitFailed},
		{[]string{"install", "--flowcontrol=maybe"}, exitUsage},
		{[]string{"install", "--fleet=often"}, exitUsage},
	} {
		var out, stderr bytes.Buffer
		if code := exitCode(run(context.Background(), tc.args, &out, &stderr), &stderr); code != tc.want {
			t.Errorf("%q: exit %d, want %d\n%s", tc.args, code, tc.want, stderr.String())
		}
	}
	var stderr bytes.Buffer
	_ = run(context.Background(), []string{"install", "--help"}, io.Discard, &stderr)
	for _, want := range []string{"-flowcontrol", "--flowcontrol=false", "-fleet", "fleet 0.1 100", "more than 4 replicas"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage does not say %q", want)
		}
	}
}
