package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The addresses of a node with a pod network (NodeOptions.PodNetwork), as
// kubeadm and its usual pod networks lay them out.
const (
	// ServiceCIDR is the service range; the kubernetes Service has its
	// first address.
	ServiceCIDR = "10.96.0.0/12"
	// DNSServiceIP is the kube-dns Service's ClusterIP, which the kubelet
	// gives pods as their nameserver.
	DNSServiceIP = "10.96.0.10"
	// ClusterCIDR is the pods' network; the node's pods take their
	// addresses from PodCIDR, the node's share of it.
	ClusterCIDR = "10.244.0.0/16"
	PodCIDR     = "10.244.0.0/24"
	// APIHostAddress is where the pods reach the API server through the
	// kubernetes Service: an address of the node's own (a /32 on lo), which
	// the API server advertises, since a loopback address cannot be a
	// Service's endpoint.
	APIHostAddress = "10.253.0.1"

	apiServiceIP = "10.96.0.1"
	bridgeName   = "k8sevent0"
)

// cniBridge is the pod network: a bridge the host has an address on (the
// pods' gateway), host-local addresses from PodCIDR kept under the node's
// directory, masquerading for what leaves PodCIDR, hairpin so that a pod
// reaches itself through a Service; and host ports.
const cniBridge = `{
  "cniVersion": "1.0.0",
  "name": "k8s_event",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[1]q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[2]q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %[3]q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// writeCNIConfig writes the node's only network into confDir: the pod
// network, or with none, loopback (the pods then use hostNetwork).
func (n *node) writeCNIConfig(confDir string) error {
	if !n.podNetwork {
		return os.WriteFile(filepath.Join(confDir, "99-loopback.conf"), []byte(cniLoopback), 0o644)
	}
	conf := fmt.Sprintf(cniBridge, bridgeName, PodCIDR, filepath.Join(n.dir, "cni-ipam"))
	return os.WriteFile(filepath.Join(confDir, "10-k8s_event.conflist"), []byte(conf), 0o644)
}

// writeResolvConf writes the resolv.conf the kubelet gives pods of
// dnsPolicy Default, CoreDNS's own upstream among them: the machine's
// nameservers that are not loopback (a loopback one would be the pod's own,
// and CoreDNS's loop plugin stops it), or, when the machine has none, an
// address that never answers, so that only names outside the cluster fail.
func (n *node) writeResolvConf() (string, error) {
	b, _ := os.ReadFile("/etc/resolv.conf")
	var servers []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" {
			if ip := net.ParseIP(f[1]); ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
				servers = append(servers, "nameserver "+f[1])
			}
		}
	}
	if len(servers) == 0 {
		servers = append(servers, "nameserver 203.0.113.53") // TEST-NET-3
	}
	path := filepath.Join(n.dir, "resolv.conf")
	return path, os.WriteFile(path, []byte(strings.Join(servers, "\n")+"\n"), 0o644)
}

// apiServerAddressFlags are where the API server listens and what it
// advertises: on a node with a pod network, every address (127.0.0.1 for
// the tests' clients, APIHostAddress for the pods), APIHostAddress as the
// kubernetes Service's endpoint, kept by the lease reconciler as in a
// cluster; else 127.0.0.1 alone, and no endpoint.
func apiServerAddressFlags(opts Options) []string {
	if opts.Node != nil && opts.Node.PodNetwork {
		return []string{
			"--bind-address=0.0.0.0",
			"--advertise-address=" + APIHostAddress,
			"--endpoint-reconciler-type=lease",
		}
	}
	return []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// No controller-manager keeps the endpoints of the kubernetes
		// Service, and a loopback address may not be published there.
		"--endpoint-reconciler-type=none",
	}
}

// kubeProxyConfig runs kube-proxy in iptables mode for ClusterCIDR, on
// loopback ports of its own, leaving the machine's conntrack sysctls and
// route_localnet alone.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]q
mode: iptables
clusterCIDR: %[2]q
hostnameOverride: %[3]q
healthzBindAddress: 127.0.0.1:%[4]d
metricsBindAddress: 127.0.0.1:%[5]d
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
`

// startKubeProxy starts kube-proxy as system:kube-proxy, whom the default
// RBAC binds to system:node-proxier, and waits until it has programmed
// the Services once.
func (c *Cluster) startKubeProxy(ctx context.Context, certs *pki) error {
	n := c.node
	kubeconfig, err := c.clientKubeconfig(certs, "kube-proxy", "system:kube-proxy")
	if err != nil {
		return err
	}
	healthz, err := FreePort()
	if err != nil {
		return err
	}
	metrics, err := FreePort()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(kubeProxyConfig, kubeconfig, ClusterCIDR, n.name, healthz, metrics)
	path := filepath.Join(n.dir, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return err
	}
	n.proxy, err = StartProcess("kube-proxy", filepath.Join(c.Dir, "kube-proxy.log"), nil, n.bins.proxy,
		"--config="+path, "--v=1")
	if err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(healthz) + "/healthz"
	return c.poll(ctx, n.proxy, func(ctx context.Context) error {
		_, err := HTTPGet(ctx, url)
		return err
	})
}

// KubeProxyLog returns the last n lines that kube-proxy wrote.
func (c *Cluster) KubeProxyLog(n int) string {
	if c.node == nil || c.node.proxy == nil {
		return ""
	}
	return c.node.proxy.LogTail(n)
}
