//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// manifests reads every YAML document of the files in deploy/.
func manifests(t *testing.T) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/: %v", err)
	}
	var docs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for doc := range strings.SplitSeq(string(b), "\n---") {
			if strings.Contains(doc, "kind:") {
				docs = append(docs, []byte(doc))
			}
		}
	}
	return docs
}

// manifest decodes the document of deploy/ of that kind.
func manifest(t *testing.T, kind string, into any) {
	t.Helper()
	for _, doc := range manifests(t) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind == kind {
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("deploy/ %s: %v", kind, err)
			}
			return
		}
	}
	t.Fatalf("deploy/ has no %s", kind)
}

func TestDeployManifests(t *testing.T) {
	out := kubectl(t, "apply", "--dry-run=server", "-f", filepath.Join(repoRoot, "deploy"))
	for _, obj := range []string{
		"serviceaccount/coredns", "role.rbac.authorization.k8s.io/coredns-k8s-event",
		"rolebinding.rbac.authorization.k8s.io/coredns-k8s-event", "configmap/coredns", "deployment.apps/coredns",
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(obj) + ` \S+ \(server dry run\)$`).MatchString(out) {
			t.Errorf("kubectl apply --dry-run=server: %s missing from\n%s", obj, out)
		}
	}

	t.Run("downward API", func(t *testing.T) {
		var d appsv1.Deployment
		manifest(t, "Deployment", &d)
		want := map[string]string{
			"COREDNS_POD_NAME":  "metadata.name",
			"COREDNS_NAMESPACE": "metadata.namespace",
			"COREDNS_POD_UID":   "metadata.uid",
			"COREDNS_NODE_NAME": "spec.nodeName",
		}
		got := map[string]string{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				got[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		for name, path := range want {
			if got[name] != path {
				t.Errorf("env %s: fieldPath %q, want %q", name, got[name], path)
			}
		}
		if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "coredns" {
			t.Errorf("serviceAccountName %q, want coredns", sa)
		}
	})

	t.Run("Corefile starts", func(t *testing.T) {
		var cm corev1.ConfigMap
		manifest(t, "ConfigMap", &cm)
		corefile := cm.Data["Corefile"]
		for _, want := range []string{"kubeapi", "k8s_event"} {
			if !strings.Contains(corefile, want) {
				t.Errorf("the ConfigMap's Corefile does not use %s", want)
			}
		}
		startCoreDNS(t, testPod(t), localCorefile(corefile))
	})
}

// eventRules are the rules that k8s_event needs: create and patch of core/v1
// events.
var eventRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}

func TestRBAC(t *testing.T) {
	ctx := t.Context()

	t.Run("deploy/ grants only events create and patch", func(t *testing.T) {
		var role rbacv1.Role
		manifest(t, "Role", &role)
		if got := flatten(role.Rules); !slices.Equal(got, flatten(eventRules)) {
			t.Errorf("deploy/ Role grants %v, want %v", got, flatten(eventRules))
		}
	})

	t.Run("README grants the same as deploy/", func(t *testing.T) {
		rules := readmeRules(t)
		if got := flatten(rules); !slices.Equal(got, flatten(eventRules)) {
			t.Errorf("README.md grants %v, want %v", got, flatten(eventRules))
		}
	})

	// Run CoreDNS as the ServiceAccount of deploy/ with nothing but deploy/'s
	// RBAC: both a create and a patch must go through.
	kubectl(t, "apply", "-f", filepath.Join(repoRoot, "deploy", "rbac.yaml"))
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

		// What the ServiceAccount may do beyond what any authenticated
		// user may do must be exactly eventRules.
		baseline, err := kube.ServiceAccountKubeconfig(ctx, "kube-system", "nobody")
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

// readmeRules collects the RBAC rules about events that README.md shows,
// whether as a whole Role or ClusterRole or as a list of rules.
func readmeRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	var rules []rbacv1.PolicyRule
	for _, block := range fencedBlocks(t, regexp.MustCompile("^(```|~~~)\\s*(ya?ml)?\\s*$")) {
		if !strings.Contains(block, "events") || !strings.Contains(block, "verbs") {
			continue
		}
		for doc := range strings.SplitSeq(block, "\n---") {
			var role rbacv1.ClusterRole
			if yaml.Unmarshal([]byte(doc), &role) == nil && len(role.Rules) > 0 {
				rules = append(rules, role.Rules...)
				continue
			}
			var list []rbacv1.PolicyRule
			if err := yaml.Unmarshal([]byte(doc), &list); err != nil {
				t.Errorf("README.md: a block about events and verbs is neither a role nor a list of rules: %v\n%s", err, doc)
			}
			rules = append(rules, list...)
		}
	}
	if len(rules) == 0 {
		t.Fatal("README.md shows no RBAC rules for events")
	}
	return rules
}

// fencedBlocks returns the contents of README.md's fenced blocks whose
// opening line matches open.
func fencedBlocks(t *testing.T, open *regexp.Regexp) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
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
	return blocks
}

func TestREADMECorefiles(t *testing.T) {
	blocks := fencedBlocks(t, regexp.MustCompile(`^~~~\s*corefile\s*$`))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ~~~ corefile example")
	}
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
		case depth == 1 && fields[0] == "loop":
		case depth == 1 && fields[0] == "forward" && len(fields) >= 3:
			forward := "    forward " + fields[1] + " {{freeAddr}}"
			if next > depth {
				forward += " {"
			}
			out = append(out, forward)
		case depth == 1 && len(fields) == 1 && slices.Contains([]string{"health", "ready", "prometheus"}, fields[0]):
			out = append(out, "    "+fields[0]+" {{freeAddr}}")
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
