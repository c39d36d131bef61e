package main

import "text/template"

// manifestTemplate is the plugin's krew manifest (krew-index's
// plugins/coredns-k8s-event.yaml): one platform a archive, each with the
// program and the LICENSE.
var manifestTemplate = template.Must(template.New("manifest").Parse(`apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: {{.Name}}
spec:
  version: {{.Version}}
  homepage: https://github.com/dnsops/k8s_event
  shortDescription: Report CoreDNS log lines as Kubernetes Events
  description: |
    Adds the k8s_event plugin to the CoreDNS a cluster runs, and takes it
    out again. k8s_event turns CoreDNS's log lines (errors, warnings,
    failed upstreams) into Kubernetes Events on the CoreDNS pod, so that
    kubectl get events shows what CoreDNS says.

    install runs the CoreDNS Deployment with an image of CoreDNS that holds
    k8s_event, its Corefile with kubeapi and k8s_event, and a Role and
    RoleBinding that let it create events; uninstall gives back what it
    changed; status says what is installed and what keeps it from working.
  caveats: |
    install needs an image of CoreDNS with k8s_event, on the CoreDNS release
    the cluster runs: see https://github.com/dnsops/k8s_event/blob/main/docs/install.md.
    The person who runs it needs the Role in deploy/kubectl-k8s-event/role.yaml,
    and its ClusterRole for the priority level (not with --flowcontrol=false).
  platforms:
{{- range .Platforms}}
  - selector:
      matchLabels:
        os: {{.OS}}
        arch: {{.Arch}}
    uri: {{.URI}}
    sha256: {{.SHA256}}
    bin: {{.Bin}}
    files:
    - from: {{.Bin}}
      to: .
    - from: LICENSE
      to: .
{{- end}}
`))
