// Package deploy gives programs the manifests of this directory that they
// apply as they are: the priority level of k8s_event's event writes at the
// API server (k8s_event/flowcontrol), for a CoreDNS of any ServiceAccount.
package deploy

import (
	"bytes"
	_ "embed"
	"fmt"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"sigs.k8s.io/yaml"
)

// PriorityLevelName names the PriorityLevelConfiguration of the event writes:
// one level for every CoreDNS of the cluster that runs k8s_event.
const PriorityLevelName = "k8s-event"

//go:embed k8s_event/flowcontrol/flowcontrol.yaml
var flowControlYAML []byte

// FlowSchemaName names the FlowSchema of the ServiceAccount serviceAccount.
func FlowSchemaName(serviceAccount string) string { return "k8s-event-" + serviceAccount }

// FlowControl returns the objects of k8s_event/flowcontrol/flowcontrol.yaml:
// the priority level, and the FlowSchema that puts into it the event writes
// (create, patch, update; core and events.k8s.io) of the ServiceAccount
// namespace/serviceAccount in its own namespace, e.g. kube-system/coredns or
// kube-system/node-local-dns. Apply the level first: a FlowSchema that names
// a missing level is dangling, and its requests go to the next match.
func FlowControl(namespace, serviceAccount string) (*flowcontrolv1.PriorityLevelConfiguration, *flowcontrolv1.FlowSchema, error) {
	pl, fs, err := decodeFlowControl(flowControlYAML)
	if err != nil {
		return nil, nil, fmt.Errorf("flowcontrol.yaml: %w", err)
	}
	fs.Name = FlowSchemaName(serviceAccount)
	rule := &fs.Spec.Rules[0]
	rule.Subjects[0].ServiceAccount = &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: serviceAccount}
	rule.ResourceRules[0].Namespaces = []string{namespace}
	return pl, fs, nil
}

func decodeFlowControl(data []byte) (*flowcontrolv1.PriorityLevelConfiguration, *flowcontrolv1.FlowSchema, error) {
	docs := bytes.Split(data, []byte("\n---\n"))
	if len(docs) != 2 {
		return nil, nil, fmt.Errorf("%d documents, want 2", len(docs))
	}
	pl := &flowcontrolv1.PriorityLevelConfiguration{}
	if err := yaml.UnmarshalStrict(docs[0], pl); err != nil {
		return nil, nil, err
	}
	fs := &flowcontrolv1.FlowSchema{}
	if err := yaml.UnmarshalStrict(docs[1], fs); err != nil {
		return nil, nil, err
	}
	if pl.Kind != "PriorityLevelConfiguration" || fs.Kind != "FlowSchema" || len(fs.Spec.Rules) != 1 ||
		len(fs.Spec.Rules[0].Subjects) != 1 || len(fs.Spec.Rules[0].ResourceRules) != 1 {
		return nil, nil, fmt.Errorf("not one level and one FlowSchema of one subject and one rule")
	}
	return pl, fs, nil
}
