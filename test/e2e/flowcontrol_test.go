//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dnsops/k8s_event/deploy"
)

// Headers by which kube-apiserver names the FlowSchema and the priority
// level that a request was classified into.
const (
	headerFlowSchema    = "X-Kubernetes-PF-FlowSchema-UID"
	headerPriorityLevel = "X-Kubernetes-PF-PriorityLevel-UID"
)

// TestFlowControlLevelTakesTheEventWritesOfCoreDNSAndNotItsReads applies the
// component deploy/k8s_event/flowcontrol, then makes requests as the
// ServiceAccount kube-system/coredns with a token of its own (the admin is in
// system:masters, which APF exempts): the event writes, core and
// events.k8s.io, are dispatched in the level k8s-event; the list of Services
// and EndpointSlices stays in kube-system-service-accounts. The objects the
// installer takes from package deploy do the same for node-local-dns.
func TestFlowControlLevelTakesTheEventWritesOfCoreDNSAndNotItsReads(t *testing.T) {
	ctx := t.Context()
	if err := installStockDNS(); err != nil { // the ServiceAccount and its reads (system:coredns)
		t.Fatal(err)
	}
	grantEventWrites(t, "coredns", "node-local-dns")
	dir := t.TempDir()
	component := filepath.Join(repoRoot, "deploy", "k8s_event", "flowcontrol")
	rel, err := filepath.Rel(dir, component)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n- " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-k", dir)
	fc := kube.Clientset.FlowcontrolV1()
	t.Cleanup(func() {
		ctx := context.Background()
		for _, sa := range []string{"coredns", "node-local-dns"} {
			fc.FlowSchemas().Delete(ctx, deploy.FlowSchemaName(sa), metav1.DeleteOptions{})
		}
		fc.PriorityLevelConfigurations().Delete(ctx, deploy.PriorityLevelName, metav1.DeleteOptions{})
	})
	pl, err := fc.PriorityLevelConfigurations().Get(ctx, deploy.PriorityLevelName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := fc.FlowSchemas().Get(ctx, "kube-system-service-accounts", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	coredns := serviceAccountHTTP(t, "coredns")

	// The API server takes the new configuration in a moment, asynchronously.
	write := func(c *saClient, method, path, body string) (string, string) {
		t.Helper()
		return c.do(t, method, path, "application/json", body, http.StatusCreated, http.StatusOK)
	}
	event := func(api, name string) string {
		if api == "events.k8s.io/v1" {
			return fmt.Sprintf(`{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":%q},`+
				`"eventTime":"2026-01-01T00:00:00.000000Z","reportingController":"k8s_event","reportingInstance":"e2e",`+
				`"action":"Logged","reason":"CoreDNSError","type":"Warning","note":"classified",`+
				`"regarding":{"kind":"Pod","namespace":"kube-system","name":"coredns-flowcontrol"}}`, name)
		}
		return fmt.Sprintf(`{"apiVersion":"v1","kind":"Event","metadata":{"name":%q},"reason":"CoreDNSError",`+
			`"type":"Warning","message":"classified","count":1,`+
			`"involvedObject":{"kind":"Pod","namespace":"kube-system","name":"coredns-flowcontrol"}}`, name)
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		_, level := write(coredns, http.MethodPost, "/api/v1/namespaces/kube-system/events", event("v1", fmt.Sprintf("fc-wait-%s-%d", suffix, i)))
		if level == string(pl.UID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a create of an event as kube-system/coredns is still dispatched in level UID %q after %s, want %s's %q",
				level, timeout, pl.Name, pl.UID)
		}
		time.Sleep(100 * time.Millisecond)
	}

	core := "/api/v1/namespaces/kube-system/events/"
	name := "fc-core-" + suffix
	newer := "/apis/events.k8s.io/v1/namespaces/kube-system/events/"
	nameNew := "fc-new-" + suffix
	writes := []struct {
		what, method, path, contentType, body string
	}{
		{"create core", http.MethodPost, core[:len(core)-1], "application/json", event("v1", name)},
		{"patch core", http.MethodPatch, core + name, "application/strategic-merge-patch+json", `{"count":2}`},
		{"update core", http.MethodPut, core + name, "application/json", event("v1", name)},
		{"create events.k8s.io", http.MethodPost, newer[:len(newer)-1], "application/json", event("events.k8s.io/v1", nameNew)},
		{"patch events.k8s.io", http.MethodPatch, newer + nameNew, "application/merge-patch+json", `{"metadata":{"labels":{"patched":"yes"}}}`},
		{"update events.k8s.io", http.MethodPut, newer + nameNew, "application/json", event("events.k8s.io/v1", nameNew)},
	}
	for _, w := range writes {
		if w.method == http.MethodPut { // an update names the version it replaces
			w.body = withResourceVersion(t, coredns, w.path, w.body)
		}
		schema, level := coredns.do(t, w.method, w.path, w.contentType, w.body, http.StatusCreated, http.StatusOK)
		if level != string(pl.UID) {
			t.Errorf("%s as kube-system/coredns: priority level UID %q, want %s's %q (FlowSchema %q)", w.what, level, pl.Name, pl.UID, schema)
		}
	}
	for _, path := range []string{"/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices",
		"/api/v1/services?watch=1&timeoutSeconds=1", "/apis/discovery.k8s.io/v1/endpointslices?watch=1&timeoutSeconds=1"} {
		schema, level := coredns.do(t, http.MethodGet, path, "", "", http.StatusOK)
		if level == string(pl.UID) || schema != string(other.UID) {
			t.Errorf("GET %s as kube-system/coredns: FlowSchema UID %q and level UID %q, want %s's %q and not %q",
				path, schema, level, other.Name, other.UID, pl.UID)
		}
	}

	// node-local-dns, through the objects package deploy gives the installer.
	_, fs, err := deploy.FlowControl("kube-system", "node-local-dns")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	local := serviceAccountHTTP(t, "node-local-dns")
	for i := 0; ; i++ {
		_, level := write(local, http.MethodPost, "/api/v1/namespaces/kube-system/events", event("v1", fmt.Sprintf("fc-local-%s-%d", suffix, i)))
		if level == string(pl.UID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a create of an event as kube-system/node-local-dns: priority level UID %q, want %q", level, pl.UID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if schema, level := local.do(t, http.MethodGet, "/api/v1/services", "", "", http.StatusOK); level == string(pl.UID) || schema != string(other.UID) {
		t.Errorf("a list of Services as kube-system/node-local-dns: FlowSchema %q, level %q", schema, level)
	}
	var status *flowcontrolv1.FlowSchemaStatus
	if got, err := fc.FlowSchemas().Get(ctx, fs.Name, metav1.GetOptions{}); err == nil {
		status = &got.Status
	}
	t.Logf("FlowSchema %s status: %+v", fs.Name, status)
}

// grantEventWrites lets the ServiceAccounts of kube-system create, patch and
// update events, core and events.k8s.io, for as long as the test runs: more
// than k8s_event needs, for the classification of each write to be seen
// answered.
func grantEventWrites(t *testing.T, accounts ...string) {
	t.Helper()
	ctx := t.Context()
	name := "k8s-event-flowcontrol-e2e"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"},
			Verbs: []string{"create", "patch", "update", "get"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
	}
	for _, sa := range accounts {
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: sa, Namespace: "kube-system"})
	}
	reads := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
		Subjects:   binding.Subjects,
	}
	rbac := kube.Clientset.RbacV1()
	if _, err := rbac.Roles("kube-system").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings("kube-system").Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, reads, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		rbac.RoleBindings("kube-system").Delete(ctx, name, metav1.DeleteOptions{})
		rbac.Roles("kube-system").Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// saClient makes raw requests as a ServiceAccount, to read the answer's
// headers.
type saClient struct {
	http   *http.Client
	server string
}

func serviceAccountHTTP(t *testing.T, sa string) *saClient {
	t.Helper()
	path, err := kube.ServiceAccountKubeconfig(t.Context(), "kube-system", sa)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &saClient{http: hc, server: cfg.Host}
}

// do sends a request and returns the UIDs of the FlowSchema and the
// priority level that the API server dispatched it in; a status other than
// want fails the test.
func (c *saClient) do(t *testing.T, method, path, contentType, body string, want ...int) (flowSchema, level string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, c.server+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	ok := false
	for _, code := range want {
		ok = ok || resp.StatusCode == code
	}
	if !ok {
		t.Fatalf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	return resp.Header.Get(headerFlowSchema), resp.Header.Get(headerPriorityLevel)
}

// withResourceVersion sets the resourceVersion of the object at path into
// body, an object of the same kind.
func withResourceVersion(t *testing.T, c *saClient, path, body string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, c.server+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var current struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&current); err != nil || current.Metadata.ResourceVersion == "" {
		t.Fatalf("GET %s: %s: %v", path, resp.Status, err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(body), &obj); err != nil {
		t.Fatal(err)
	}
	obj["metadata"].(map[string]any)["resourceVersion"] = current.Metadata.ResourceVersion
	out, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
