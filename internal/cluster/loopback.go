package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// loopbackKustomization holds what only a node on loopback needs, never
// part of what users apply: the pods reach the API only with hostNetwork
// and the API server's loopback address; and with hostNetwork every
// container port is a host port, which
// would keep two replicas off one node, so the ports go (CoreDNS binds its
// sockets with SO_REUSEPORT) and the probes name port numbers.
const loopbackKustomization = `# Written by the cluster package for a node on loopback; not for users.
resources:
- %[1]s
patches:
- target: {kind: Deployment, name: coredns}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/image
      value: %[2]q
    - op: add
      path: /spec/template/spec/hostNetwork
      value: true
    - op: remove
      path: /spec/template/spec/containers/0/ports
    - op: replace
      path: /spec/template/spec/containers/0/livenessProbe/httpGet/port
      value: 8080
    - op: replace
      path: /spec/template/spec/containers/0/readinessProbe/httpGet/port
      value: 8181
- target: {kind: Deployment, name: coredns}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: coredns
    spec:
      template:
        spec:
          containers:
          - name: coredns
            env:
            - name: KUBERNETES_SERVICE_HOST
              value: "127.0.0.1"
            - name: KUBERNETES_SERVICE_PORT
              value: "%[3]d"
`

// podNetworkKustomization sets the image, which a cluster also does, and
// nothing else: on a node with a pod network the stock objects run as
// they are, and the node pulls the image from its registry.
const podNetworkKustomization = `# Written by the cluster package for its node; not for users.
resources:
- %[1]s
images:
- name: %[2]s
  newName: %[3]s
  newTag: %[4]s
`

// WriteNodeKustomization writes into dir a kustomization that applies
// base (a directory, e.g. deploy/k8s_event) with the node's image (a
// full reference with a tag, e.g. localhost/NAME:TAG, whatever image base
// names), and on a node without a pod network what CoreDNS needs there:
// hostNetwork, the API server's loopback address and no host ports.
// Apply it with `kubectl apply -k dir`.
func (c *Cluster) WriteNodeKustomization(dir, base, image string) error {
	if i := strings.LastIndexAny(image, ":@"); i < 0 || i < strings.LastIndex(image, "/") || strings.ContainsAny(image, " \n\"") {
		return fmt.Errorf("image %q: want a reference with a tag or digest, e.g. localhost/NAME:TAG", image)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	absBase, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	// kustomize takes relative paths only.
	rel, err := filepath.Rel(absDir, absBase)
	if err != nil {
		return err
	}
	k := fmt.Sprintf(loopbackKustomization, rel, image, c.Port())
	if c.node != nil && c.node.podNetwork {
		from, err := baseImage(c.kubectl, absBase)
		if err != nil {
			return err
		}
		i := strings.LastIndexByte(image, ':')
		k = fmt.Sprintf(podNetworkKustomization, rel, from, image[:i], image[i+1:])
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// baseImage is the name of the image of base's coredns Deployment, as
// kustomize renders it.
func baseImage(kubectl, base string) (string, error) {
	out, err := exec.Command(kubectl, "kustomize", base).Output()
	if err != nil {
		return "", fmt.Errorf("kubectl kustomize %s: %w", base, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "image:" {
			name := strings.Trim(f[1], `"`)
			if i := strings.LastIndexAny(name, ":@"); i > strings.LastIndexByte(name, '/') {
				name = name[:i]
			}
			return name, nil
		}
	}
	return "", fmt.Errorf("%s renders no image", base)
}
