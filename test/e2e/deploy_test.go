//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// Paths of the kustomizations in deploy/.
var (
	kubeadmDir = func() string { return filepath.Join(repoRoot, "deploy", "kubeadm") }
	overlayDir = func() string { return filepath.Join(repoRoot, "deploy", "k8s_event") }
)

// manifests is what `kubectl kustomize` makes of the overlay, a document each.
func manifests(t *testing.T) [][]byte {
	t.Helper()
	var docs [][]byte
	for doc := range strings.SplitSeq(kubectl(t, "kustomize", overlayDir()), "\n---") {
		if strings.Contains(doc, "kind:") {
			docs = append(docs, []byte(doc))
		}
	}
	return docs
}

// manifest decodes the document of the overlay of that kind (and, for
// ConfigMaps, the one the overlay generates).
func manifest(t *testing.T, kind string, into any) {
	t.Helper()
	for _, doc := range manifests(t) {
		var meta struct {
			metav1.TypeMeta
			Metadata metav1.ObjectMeta
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind == kind && (kind != "ConfigMap" || strings.HasPrefix(meta.Metadata.Name, "coredns-k8s-event-")) {
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("overlay %s: %v", kind, err)
			}
			return
		}
	}
	t.Fatalf("the overlay has no %s", kind)
}

// installStockDNS puts a cluster DNS as kubeadm lays it out into
// kube-system, once.
var installStockDNS = sync.OnceValue(func() error {
	_, stderr, err := kube.Kubectl(context.Background(), "apply", "-k", kubeadmDir())
	if err != nil {
		return fmt.Errorf("kubectl apply -k deploy/kubeadm: %v: %s", err, stderr)
	}
	return nil
})

// TestOverlay applies the overlay over a cluster DNS as kubeadm lays it
// out: what it makes, that the API server takes it, and that it changes
// nothing but what k8s_event needs.
func TestOverlay(t *testing.T) {
	ctx := t.Context()
	if err := installStockDNS(); err != nil {
		t.Fatal(err)
	}
	cs := kube.Clientset
	stock, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := cs.CoreV1().ServiceAccounts("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	out := kubectl(t, "apply", "--dry-run=server", "-k", overlayDir())
	for _, obj := range []string{
		"role.rbac.authorization.k8s.io/coredns-k8s-event", "rolebinding.rbac.authorization.k8s.io/coredns-k8s-event",
		"configmap/coredns", "configmap/coredns-k8s-event-", "deployment.apps/coredns",
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(obj) + `\S* \S+ \(server dry run\)$`).MatchString(out) {
			t.Errorf("kubectl apply -k --dry-run=server: %s missing from\n%s", obj, out)
		}
	}
	for _, untouched := range []string{"service/", "serviceaccount/", "clusterrole"} {
		if strings.Contains(out, untouched) {
			t.Errorf("the overlay touches a %s object:\n%s", untouched, out)
		}
	}
	t.Logf("kubectl apply --dry-run=server -k deploy/k8s_event:\n%s", out)
	kubectl(t, "apply", "-k", overlayDir())

	d, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Spec.Selector, stock.Spec.Selector) || d.Spec.Template.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("selector %v and labels %v, want the stock %v", d.Spec.Selector, d.Spec.Template.Labels, stock.Spec.Selector)
	}
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("strategy %+v, want a rolling update, one pod at a time", d.Spec.Strategy)
	}
	if d.Generation == stock.Generation {
		t.Error("the Deployment did not change")
	}
	if got, err := cs.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{}); err != nil || got.ResourceVersion != svc.ResourceVersion {
		t.Errorf("the Service changed (%v)", err)
	}
	if got, err := cs.CoreV1().ServiceAccounts("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); err != nil || got.ResourceVersion != sa.ResourceVersion {
		t.Errorf("the ServiceAccount changed (%v)", err)
	}

	t.Run("Deployment", func(t *testing.T) {
		var d appsv1.Deployment
		manifest(t, "Deployment", &d)
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		want := map[string]string{
			"COREDNS_POD_NAME":  "metadata.name",
			"COREDNS_NAMESPACE": "metadata.namespace",
			"COREDNS_POD_UID":   "metadata.uid",
			"COREDNS_NODE_NAME": "spec.nodeName",
		}
		got := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				got[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("downward-API env %v, want %v", got, want)
		}
		if !strings.HasPrefix(c.Image, imageName+":") || strings.HasSuffix(c.Image, ":latest") {
			t.Errorf("image %q, want %s with a tag that is not latest", c.Image, imageName)
		}
		checks := map[string]bool{
			"name coredns in kube-system":      d.Name == "coredns" && d.Namespace == "kube-system",
			"serviceAccountName coredns":       spec.ServiceAccountName == "coredns",
			"dnsPolicy Default":                spec.DNSPolicy == corev1.DNSDefault,
			"priorityClassName":                spec.PriorityClassName == "system-cluster-critical",
			"nodeSelector linux":               spec.NodeSelector["kubernetes.io/os"] == "linux",
			"CriticalAddonsOnly toleration":    slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "CriticalAddonsOnly" }),
			"anti-affinity":                    spec.Affinity != nil && spec.Affinity.PodAntiAffinity != nil,
			"liveness /health with 5 failures": c.LivenessProbe != nil && c.LivenessProbe.HTTPGet.Path == "/health" && c.LivenessProbe.FailureThreshold == 5 && c.LivenessProbe.InitialDelaySeconds == 60,
			"readiness /ready":                 c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Path == "/ready",
			"memory limit 170Mi":               c.Resources.Limits.Memory().String() == "170Mi",
			"no privilege escalation":          c.SecurityContext != nil && c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation,
			"read-only root":                   c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem,
			"drop ALL, add NET_BIND_SERVICE":   reflect.DeepEqual(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}) && reflect.DeepEqual(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_BIND_SERVICE"}),
			"args -conf /etc/coredns/Corefile": slices.Equal(c.Args, []string{"-conf", "/etc/coredns/Corefile"}),
			"imagePullPolicy IfNotPresent":     c.ImagePullPolicy == corev1.PullIfNotPresent,
		}
		for what, ok := range checks {
			if !ok {
				t.Errorf("Deployment: not %s", what)
			}
		}
	})

	t.Run("Corefile", func(t *testing.T) {
		var cm corev1.ConfigMap
		manifest(t, "ConfigMap", &cm)
		corefile := cm.Data["Corefile"]
		for _, want := range []string{
			"kubeapi", "k8s_event", "kubernetes cluster.local in-addr.arpa ip6.arpa", "forward . /etc/resolv.conf",
			"cache 30", "loop", "reload", "health", "ready", "prometheus :9153", "errors", "loadbalance",
		} {
			if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(want) + `( \{)?$`).MatchString(corefile) {
				t.Errorf("the Corefile has no %q:\n%s", want, corefile)
			}
		}
		c := startCoreDNS(t, testPod(t), localCorefile(corefile))
		if r := c.query("kubernetes.default.svc.cluster.local.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
			t.Errorf("kubernetes.default.svc.cluster.local.: %s, want an answer from the kubernetes plugin", dns.RcodeToString[r.Rcode])
		}
	})

	t.Run("Role, and the PodDisruptionBudget opt-in", func(t *testing.T) {
		var role rbacv1.Role
		manifest(t, "Role", &role)
		if got := flatten(role.Rules); role.Namespace != "kube-system" || !slices.Equal(got, flatten(eventRules)) {
			t.Errorf("Role in %q grants %v, want %v in kube-system", role.Namespace, got, flatten(eventRules))
		}
		var rb rbacv1.RoleBinding
		manifest(t, "RoleBinding", &rb)
		if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != "coredns" || rb.Subjects[0].Namespace != "kube-system" || rb.RoleRef.Name != role.Name {
			t.Errorf("RoleBinding %+v, want the Role bound to kube-system/coredns", rb)
		}
		for _, doc := range manifests(t) {
			if strings.Contains(string(doc), "kind: PodDisruptionBudget") {
				t.Errorf("the overlay has a PodDisruptionBudget: it keeps a single node from draining")
			}
		}
		// With the component pdb/.
		dir := t.TempDir()
		rel, _ := filepath.Rel(dir, overlayDir())
		k := fmt.Sprintf("resources:\n- %s\ncomponents:\n- %s/pdb\n", rel, rel)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		var pdb policyv1.PodDisruptionBudget
		for doc := range strings.SplitSeq(kubectl(t, "kustomize", dir), "\n---") {
			if strings.Contains(doc, "kind: PodDisruptionBudget") {
				if err := yaml.UnmarshalStrict([]byte(doc), &pdb); err != nil {
					t.Fatal(err)
				}
			}
		}
		if pdb.Spec.Selector == nil {
			t.Fatal("the component pdb/ adds no PodDisruptionBudget")
		}
		if pdb.Spec.Selector.MatchLabels["k8s-app"] != "kube-dns" || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PodDisruptionBudget %+v, want one kube-dns pod at most unavailable", pdb.Spec)
		}
	})
}

// imageName is the name `make image` gives the image; the example names it.
const imageName = "localhost/coredns-k8s-event"

// eventRules are the rules that k8s_event needs: create and patch of core/v1
// events.
var eventRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}

func TestRBAC(t *testing.T) {
	ctx := t.Context()

	t.Run("README grants the same as the overlay", func(t *testing.T) {
		rules := readmeRules(t)
		if got := flatten(rules); !slices.Equal(got, flatten(eventRules)) {
			t.Errorf("README.md grants %v, want %v", got, flatten(eventRules))
		}
		for _, doc := range documents(t)[1:] {
			if rules := docRules(t, doc); len(rules) > 0 && !slices.Equal(flatten(rules), flatten(eventRules)) {
				t.Errorf("%s grants %v, want %v", doc, flatten(rules), flatten(eventRules))
			}
		}
	})

	// Run CoreDNS as the ServiceAccount of deploy/ with nothing but deploy/'s
	// RBAC: both a create and a patch must go through.
	if err := installStockDNS(); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", filepath.Join(overlayDir(), "component", "rbac.yaml"))
	kubeconfig, err := kube.ServiceAccountKubeconfig(ctx, "kube-system", "coredns")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := kube.CreatePod(ctx, "kube-system", "coredns-rbac")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kube.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	})
	c := startCoreDNS(t, pod, levelsCorefile, withKubeconfig(kubeconfig))
	const line = "written with the least privilege"
	c.logLine("warning", 1, line)
	waitEvents(t, pod, "the created event", func(evs []corev1.Event) bool {
		return len(withMessage(evs, line)) == 1
	})
	c.logLine("warning", 1, line)
	waitEvents(t, pod, "the patched event", func(evs []corev1.Event) bool {
		evs = withMessage(evs, line)
		return len(evs) == 1 && evs[0].Count == 2
	})
	if c.LogContains("forbidden") {
		t.Errorf("coredns was refused:\n%s", c.LogTail(20))
	}

	t.Run("nothing more", func(t *testing.T) {
		user := "system:serviceaccount:kube-system:coredns"
		for _, check := range []struct {
			args []string
			want string
		}{
			{[]string{"create", "events", "-n", "kube-system"}, "yes"},
			{[]string{"patch", "events", "-n", "kube-system"}, "yes"},
			{[]string{"update", "events", "-n", "kube-system"}, "no"},
			{[]string{"delete", "events", "-n", "kube-system"}, "no"},
			{[]string{"list", "events", "-n", "kube-system"}, "no"},
			{[]string{"create", "events.events.k8s.io", "-n", "kube-system"}, "no"},
			{[]string{"create", "events", "-n", "default"}, "no"},
			{[]string{"get", "pods", "-n", "kube-system"}, "no"},
		} {
			// can-i exits 1 when the answer is no.
			out, _, _ := kube.Kubectl(ctx, append([]string{"auth", "can-i", "--as", user}, check.args...)...)
			if got := strings.TrimSpace(out); got != check.want {
				t.Errorf("kubectl auth can-i %s as %s: %q, want %q", strings.Join(check.args, " "), user, got, check.want)
			}
		}

		// What the ServiceAccount may do beyond what kubeadm's CoreDNS
		// may do must be exactly eventRules.
		kubectl(t, "create", "serviceaccount", "-n", "kube-system", "coredns-stock")
		kubectl(t, "create", "clusterrolebinding", "coredns-stock", "--clusterrole=system:coredns", "--serviceaccount=kube-system:coredns-stock")
		baseline, err := kube.ServiceAccountKubeconfig(ctx, "kube-system", "coredns-stock")
		if err != nil {
			t.Fatal(err)
		}
		extra := slices.DeleteFunc(resourceRules(t, kubeconfig), func(r string) bool {
			return slices.Contains(resourceRules(t, baseline), r)
		})
		if want := flatten(eventRules); !slices.Equal(extra, want) {
			t.Errorf("the coredns ServiceAccount may %v beyond the baseline, want %v", extra, want)
		}
	})
}

// flatten turns rules into sorted "group/resource:verb" strings.
func flatten(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+"/"+res+":"+v)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// resourceRules asks the API server what the user of kubeconfig may do in
// kube-system.
func resourceRules(t *testing.T, kubeconfig string) []string {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kubernetes.NewForConfigOrDie(cfg).AuthorizationV1().SelfSubjectRulesReviews().Create(t.Context(),
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: "kube-system"}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	for _, r := range review.Status.ResourceRules {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: r.APIGroups, Resources: r.Resources, Verbs: r.Verbs})
	}
	return flatten(rules)
}

// documents returns the paths, relative to the repository, of the
// documents whose examples the tests check: README.md first, then
// CONTRIBUTING.md and docs/*.md.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no documents in docs/: %v", err)
	}
	out := []string{"README.md", "CONTRIBUTING.md"}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", filepath.Base(d)))
	}
	return out
}

// readmeRules collects the RBAC rules about events that README.md shows,
// whether as a whole Role or ClusterRole or as a list of rules.
func readmeRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	rules := docRules(t, "README.md")
	if len(rules) == 0 {
		t.Fatal("README.md shows no RBAC rules for events")
	}
	return rules
}

// docRules collects the RBAC rules about events that doc shows, whether as
// a whole Role or ClusterRole or as a list of rules.
func docRules(t *testing.T, doc string) []rbacv1.PolicyRule {
	t.Helper()
	var rules []rbacv1.PolicyRule
	for _, block := range fencedBlocks(t, regexp.MustCompile("^(```|~~~)\\s*(ya?ml)?\\s*$"), doc) {
		if !strings.Contains(block, "events") || !strings.Contains(block, "verbs") {
			continue
		}
		for part := range strings.SplitSeq(block, "\n---") {
			var role rbacv1.ClusterRole
			if yaml.Unmarshal([]byte(part), &role) == nil && len(role.Rules) > 0 {
				rules = append(rules, role.Rules...)
				continue
			}
			var list []rbacv1.PolicyRule
			if err := yaml.Unmarshal([]byte(part), &list); err != nil {
				t.Errorf("%s: a block about events and verbs is neither a role nor a list of rules: %v\n%s", doc, err, part)
			}
			rules = append(rules, list...)
		}
	}
	return rules
}

// fencedBlocks returns the contents of the fenced blocks of docs (paths
// relative to the repository) whose opening line matches open.
func fencedBlocks(t *testing.T, open *regexp.Regexp, docs ...string) []string {
	t.Helper()
	var blocks []string
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(repoRoot, doc))
		if err != nil {
			t.Fatal(err)
		}
		var cur []string
		fence := ""
		for line := range strings.Lines(string(b)) {
			line = strings.TrimRight(line, "\n")
			switch {
			case fence == "" && open.MatchString(line):
				fence, cur = line[:3], nil
			case fence != "" && strings.TrimSpace(line) == fence:
				blocks = append(blocks, strings.Join(cur, "\n")+"\n")
				fence = ""
			case fence != "":
				cur = append(cur, line)
			}
		}
	}
	return blocks
}

func TestREADMECorefiles(t *testing.T) {
	corefile := regexp.MustCompile(`^~~~\s*corefile\s*$`)
	if len(fencedBlocks(t, corefile, "README.md")) == 0 {
		t.Fatal("README.md has no ~~~ corefile example")
	}
	blocks := fencedBlocks(t, corefile, documents(t)...)
	for i, corefile := range blocks {
		t.Run(fmt.Sprintf("example %d", i+1), func(t *testing.T) {
			pod := testPod(t)
			c := startCoreDNS(t, pod, localCorefile(corefile))
			if c.Exited() {
				t.Fatalf("coredns exited:\n%s", c.LogTail(20))
			}
		})
	}
}

// localCorefile turns a Corefile written for a cluster into a template that
// runs here: servers listen on the test's DNS port, kubeapi uses the test's
// kubeconfig, every other address is a free loopback port, forward sends to
// a loopback port where nothing listens, and loop (which queries upstream at
// startup) is left out. Nothing leaves the machine.
func localCorefile(corefile string) string {
	var out []string
	depth, skipTo := 0, -1
	for line := range strings.Lines(corefile) {
		line = strings.TrimRight(line, "\n")
		trimmed := strings.TrimSpace(line)
		fields := strings.Fields(trimmed)
		next := depth + strings.Count(line, "{") - strings.Count(line, "}")
		switch {
		case skipTo >= 0:
			// inside a replaced block
		case trimmed == "" || strings.HasPrefix(trimmed, "#"):
			out = append(out, line)
		case depth == 0 && strings.HasSuffix(trimmed, "{"):
			keys := fields[:len(fields)-1]
			for i, k := range keys {
				keys[i] = regexp.MustCompile(`(:\d+)?$`).ReplaceAllString(k, ":{{.DNS}}")
			}
			out = append(out, strings.Join(keys, " ")+" {")
		case depth == 1 && fields[0] == "kubeapi":
			out = append(out, "    kubeapi {", "        kubeconfig {{.Kubeconfig}}", "    }")
			if next > depth {
				skipTo = depth
			}
		case depth == 1 && fields[0] == "kubernetes":
			// outside a pod, the kubernetes plugin reads the test's kubeconfig
			out = append(out, line)
			if next > depth {
				out = append(out, "        kubeconfig {{.Kubeconfig}}")
			} else {
				out[len(out)-1] = line + " {\n        kubeconfig {{.Kubeconfig}}\n    }"
			}
		case depth == 1 && fields[0] == "loop":
		case depth == 1 && fields[0] == "forward" && len(fields) >= 3:
			forward := "    forward " + fields[1] + " {{freeAddr}}"
			if next > depth {
				forward += " {"
			}
			out = append(out, forward)
		case depth == 1 && slices.Contains([]string{"health", "ready", "prometheus"}, fields[0]) &&
			(len(fields) == 1 || len(fields) == 2 && fields[1] == "{"):
			// their default ports are host ports of the node's CoreDNS pods
			out = append(out, strings.Join(append([]string{"    " + fields[0], "{{freeAddr}}"}, fields[1:]...), " "))
		default:
			out = append(out, regexp.MustCompile(`(^|\s)(\[[0-9a-fA-F:]*\]|[A-Za-z0-9.\-]*):\d+\b`).ReplaceAllString(line, "$1{{freeAddr}}"))
		}
		if skipTo >= 0 && next <= skipTo {
			skipTo = -1
		}
		depth = next
	}
	return strings.Join(out, "\n") + "\n"
}
