package deploy

import (
	"math"
	"os"
	"slices"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

func TestFlowControlPutsOnlyEventWritesOfTheServiceAccountInALevelOfItsOwn(t *testing.T) {
	for _, sa := range []string{"coredns", "node-local-dns"} {
		pl, fs, err := FlowControl("kube-system", sa)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Name != PriorityLevelName || fs.Spec.PriorityLevelConfiguration.Name != PriorityLevelName {
			t.Errorf("%s: level %q, FlowSchema's level %q, want %q", sa, pl.Name, fs.Spec.PriorityLevelConfiguration.Name, PriorityLevelName)
		}
		if fs.Name != "k8s-event-"+sa {
			t.Errorf("FlowSchema %q, want k8s-event-%s", fs.Name, sa)
		}
		// kube-system-service-accounts, which holds every other request of the account, is 900.
		if p := fs.Spec.MatchingPrecedence; p <= 1 || p >= 900 {
			t.Errorf("%s: matchingPrecedence %d, want in (1, 900)", sa, p)
		}
		rule := fs.Spec.Rules[0]
		want := flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
			ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: "kube-system", Name: sa}}
		if !equality.Semantic.DeepEqual(rule.Subjects, []flowcontrolv1.Subject{want}) {
			t.Errorf("%s: subjects %+v", sa, rule.Subjects)
		}
		if len(rule.NonResourceRules) != 0 || len(rule.ResourceRules) != 1 {
			t.Fatalf("%s: rules %+v, want one resource rule", sa, rule)
		}
		r := rule.ResourceRules[0]
		if !slices.Equal(r.Verbs, []string{"create", "patch", "update"}) ||
			!slices.Equal(r.APIGroups, []string{"", "events.k8s.io"}) ||
			!slices.Equal(r.Resources, []string{"events"}) ||
			!slices.Equal(r.Namespaces, []string{"kube-system"}) || r.ClusterScope {
			t.Errorf("%s: resource rule %+v, want the writes of events in kube-system", sa, r)
		}
	}
}

// defaultShares are the nominalConcurrencyShares of the levels of the
// kube-apiserver pinned in tools/go.mod (k8s.io/apiserver
// pkg/apis/flowcontrol/bootstrap): exempt 0, catch-all 5, system 30,
// node-high 40, leader-election 10, workload-high 40, workload-low 100,
// global-default 20.
const defaultShares = 0 + 5 + 30 + 40 + 10 + 40 + 100 + 20

// seats is kube-apiserver's nominal concurrency limit of a level
// (apf_controller.go): ceil(server × shares / sum of all shares).
func seats(server, shares, sum int32) int {
	return int(math.Ceil(float64(server) * float64(shares) / float64(sum)))
}

func TestFlowControlLevelIsAHardCapOfFiveSeatsOfSixHundred(t *testing.T) {
	pl, _, err := FlowControl("kube-system", "coredns")
	if err != nil {
		t.Fatal(err)
	}
	l := pl.Spec.Limited
	if pl.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited || l == nil {
		t.Fatalf("level %+v, want Limited", pl.Spec)
	}
	shares := *l.NominalConcurrencyShares
	// docs/monitoring.md states these figures.
	if got := seats(600, shares, defaultShares+shares); got != 5 {
		t.Errorf("seats of 600: %d, want 5", got)
	}
	if got := seats(600, 40, defaultShares+shares); got != 98 {
		t.Errorf("workload-high's seats beside the level: %d, want 98", got)
	}
	if *l.LendablePercent != 0 || l.BorrowingLimitPercent == nil || *l.BorrowingLimitPercent != 0 {
		t.Errorf("lendable %v, borrowing %v: want 0 and 0, a hard cap", l.LendablePercent, l.BorrowingLimitPercent)
	}
	q := l.LimitResponse.Queuing
	if l.LimitResponse.Type != flowcontrolv1.LimitResponseTypeQueue || q == nil || q.QueueLengthLimit > 16 {
		t.Errorf("limit response %+v, want a short queue", l.LimitResponse)
	}
}

func TestFlowControlOfHelmDiffersOnlyInItsSubject(t *testing.T) {
	component, err := os.ReadFile("k8s_event/flowcontrol/flowcontrol.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(component) != string(flowControlYAML) {
		t.Fatal("the embedded manifest is not the component's")
	}
	helm, err := os.ReadFile("helm/flowcontrol.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pl, fs, err := decodeFlowControl(helm)
	if err != nil {
		t.Fatal(err)
	}
	// The chart's pods run as the ServiceAccount default unless the release makes one.
	wantPL, wantFS, err := FlowControl("kube-system", "default")
	if err != nil {
		t.Fatal(err)
	}
	wantFS.Name = FlowSchemaName("coredns") // the component's name: one or the other is applied
	if !equality.Semantic.DeepEqual(pl, wantPL) || !equality.Semantic.DeepEqual(fs, wantFS) {
		a, _ := yaml.Marshal(fs)
		b, _ := yaml.Marshal(wantFS)
		t.Errorf("helm/flowcontrol.yaml differs from the component beyond its subject:\n%s\nwant\n%s", a, b)
	}
}
