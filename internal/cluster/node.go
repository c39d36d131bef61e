package cluster

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dnsops/k8s_event/internal/image"
)

// NodeOptions ask for a node beside the control plane: containerd and runc,
// a kubelet, kube-controller-manager and kube-scheduler, so that Pods run.
//
// Without PodNetwork, the node's pods reach the API only with hostNetwork
// and the explicit address of the API server
// (KUBERNETES_SERVICE_HOST=127.0.0.1 and KUBERNETES_SERVICE_PORT=
// Cluster.Port): there is no kube-proxy, and the kubernetes Service cannot
// have a loopback endpoint.
type NodeOptions struct {
	// PodNetwork gives the node what a cluster's node has: a pod network
	// (a CNI bridge, pods on their own addresses in PodCIDR) and
	// kube-proxy in iptables mode, with the API server on APIHostAddress
	// behind the kubernetes Service. Pods then need no hostNetwork, and
	// reach the API and the kube-dns Service (DNSServiceIP) as in a
	// cluster; the host reaches both through kube-proxy's rules.
	PodNetwork bool
	// Images are image archives (OCI layouts, as `make image` writes)
	// that are pushed to Registry, each under its own repository and tag
	// (Cluster.Image says where), for the node's containerd to pull when
	// a Pod asks, by tag or by digest, as a cluster's nodes pull: from
	// the Registry by its address (plain HTTP, set in a hosts.toml), and
	// under the name the archive gives (image.Ref) from the Registry as
	// the mirror of that name's registry. Of a multi-platform index,
	// containerd pulls the node's platform only.
	Images []string
	// Registry is where Images go; nil: the process's SharedRegistry.
	Registry *Registry
	// SyncFrequency is the kubelet's syncFrequency, which bounds how soon
	// an edited ConfigMap reaches a pod's volume; 10s when zero.
	SyncFrequency time.Duration
}

// PauseImage is the sandbox image of the node's pods, made from ./pause.
const PauseImage = "localhost/k8s-event-pause:1"

// node is what runs on the machine for the node: processes, and what they
// changed that must be undone.
type node struct {
	name                                       string
	bins                                       nodeBinaries
	dir                                        string
	socket                                     string
	podNetwork                                 bool
	containerd, kubelet, kcm, scheduler, proxy *Process
	machine                                    *machine
	lock                                       *os.File // held while the node runs
	registry                                   *Registry
}

type nodeBinaries struct {
	kubelet, kcm, scheduler, proxy, containerd, shim, ctr, runc string
}

// NodeSupported tells whether this machine can run a node, and if not,
// why: it needs Linux, root, the binaries of `hack/tools.sh env node`, runc,
// the CNI plugins (loopback, bridge, host-local, portmap), iptables, ip and
// /proc/sys/net/bridge (br_netfilter, which it tries to load).
func NodeSupported() error {
	_, err := nodeBins()
	return err
}

func nodeBins() (nodeBinaries, error) {
	var b nodeBinaries
	if runtime.GOOS != "linux" {
		return b, fmt.Errorf("a node needs Linux, this is %s", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return b, errors.New("a node needs root: the kubelet and containerd mount, and change cgroups and sysctls")
	}
	var err error
	env := func(name string) string {
		path := os.Getenv(name)
		if path == "" {
			err = errors.Join(err, fmt.Errorf("%s is not set: run 'make test', or export the output of 'hack/tools.sh env node'", name))
		} else if _, statErr := os.Stat(path); statErr != nil {
			err = errors.Join(err, fmt.Errorf("%s=%s: %w", name, path, statErr))
		}
		return path
	}
	b.kubelet = env("KUBELET")
	b.kcm = env("KUBE_CONTROLLER_MANAGER")
	b.scheduler = env("KUBE_SCHEDULER")
	b.proxy = env("KUBE_PROXY")
	b.containerd = env("CONTAINERD")
	b.shim = env("CONTAINERD_SHIM")
	b.ctr = env("CTR")
	for _, tool := range []string{"runc", "iptables", "ip"} {
		path, lookErr := exec.LookPath(tool)
		if lookErr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w (hack/tools.sh node installs it)", tool, lookErr))
		}
		if tool == "runc" {
			b.runc = path
		}
	}
	for _, plugin := range []string{"loopback", "bridge", "host-local", "portmap"} {
		if _, statErr := os.Stat(cniBinDir + "/" + plugin); statErr != nil {
			err = errors.Join(err, fmt.Errorf("CNI %s plugin: %w (hack/tools.sh node installs it)", plugin, statErr))
		}
	}
	return b, errors.Join(err, bridgeNetfilter())
}

const cniBinDir = "/usr/lib/cni"

// nodeName is what the kubelet registers: the host name, lowercased.
func nodeName() (string, error) {
	h, err := os.Hostname()
	return strings.ToLower(h), err
}

// nodeAPIServerFlags issue the API server's kubelet client certificate
// and return the flags that let it reach and trust the kubelet.
func nodeAPIServerFlags(certs *pki) ([]string, error) {
	cert, key, err := certs.issueFiles("apiserver-kubelet-client", client("kube-apiserver-kubelet-client", "system:masters"))
	if err != nil {
		return nil, err
	}
	return []string{
		"--kubelet-client-certificate=" + cert,
		"--kubelet-client-key=" + key,
		"--kubelet-certificate-authority=" + certs.caFile,
		// The node's address is eth0's; its name resolves to loopback.
		"--kubelet-preferred-address-types=Hostname",
		"--enable-admission-plugins=NodeRestriction",
	}, nil
}

// startNode starts the controller manager, the scheduler, containerd and
// the kubelet, imports the images, and waits until the node is Ready.
func (c *Cluster) startNode(ctx context.Context, opts *NodeOptions, certs *pki) error {
	bins, err := nodeBins()
	if err != nil {
		return err
	}
	name, err := nodeName()
	if err != nil {
		return err
	}
	n := &node{name: name, bins: bins, dir: filepath.Join(c.Dir, "node"), podNetwork: opts.PodNetwork}
	n.socket = filepath.Join(n.dir, "containerd", "containerd.sock")
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	n.lock, err = lockMachine(ctx)
	if err != nil {
		return err
	}
	c.node = n
	n.machine, err = snapshotMachine()
	if err != nil {
		return fmt.Errorf("look at the machine before the node starts: %w", err)
	}
	c.NodeName = name
	if n.podNetwork {
		if err := preparePodNetwork(APIHostAddress); err != nil {
			return err
		}
	}

	if err := c.startControllers(certs); err != nil {
		return err
	}
	mirrored, err := n.pushImages(ctx, opts)
	if err != nil {
		return err
	}
	if err := n.startContainerd(ctx, c, mirrored); err != nil {
		return err
	}
	if err := n.importPause(ctx); err != nil {
		return err
	}
	if err := c.startKubelet(ctx, opts, certs); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx); err != nil || !n.podNetwork {
		return err
	}
	return c.startKubeProxy(ctx, certs)
}

func (c *Cluster) clientKubeconfig(certs *pki, name, user string, groups ...string) (string, error) {
	cert, key, err := certs.issueFiles(name, client(user, groups...))
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, c.writeKubeconfig(path, user, &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key})
}

// startControllers starts kube-controller-manager and kube-scheduler, each
// with its own identity, as kubeadm's static pods run them.
func (c *Cluster) startControllers(certs *pki) error {
	n := c.node
	kcmConfig, err := c.clientKubeconfig(certs, "controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	schedConfig, err := c.clientKubeconfig(certs, "scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	// With a pod network the node gets its share of ClusterCIDR, PodCIDR,
	// as a cluster's nodes do; else nothing allocates one.
	ipam := []string{"--controllers=*,-nodeipam,-bootstrapsigner,-tokencleaner"}
	if n.podNetwork {
		ipam = []string{"--controllers=*,-bootstrapsigner,-tokencleaner", "--allocate-node-cidrs=true",
			"--cluster-cidr=" + ClusterCIDR, "--node-cidr-mask-size=24", "--service-cluster-ip-range=" + ServiceCIDR}
	}
	n.kcm, err = StartProcess("kube-controller-manager", filepath.Join(c.Dir, "kube-controller-manager.log"), nil, n.bins.kcm,
		append([]string{"--kubeconfig=" + kcmConfig,
			"--authentication-kubeconfig=" + kcmConfig,
			"--authorization-kubeconfig=" + kcmConfig,
			"--bind-address=127.0.0.1",
			"--secure-port=0",
			"--leader-elect=false",
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + certs.saKey,
			"--root-ca-file=" + certs.caFile,
			"--v=1",
		}, ipam...)...,
	)
	if err != nil {
		return err
	}
	n.scheduler, err = StartProcess("kube-scheduler", filepath.Join(c.Dir, "kube-scheduler.log"), nil, n.bins.scheduler,
		"--kubeconfig="+schedConfig,
		"--authentication-kubeconfig="+schedConfig,
		"--authorization-kubeconfig="+schedConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--v=1",
	)
	return err
}

// containerdConfig keeps containerd's files under dir: its socket, root
// and state, runc's state, the CNI configuration. Pods get the cgroupfs
// driver, and no negative OOM score (root here lacks CAP_SYS_RESOURCE).
const containerdConfig = `version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %[11]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[9]q
        Root = %[10]q
        SystemdCgroup = false
`

// cniLoopback is the only network of a node without a pod network: its
// pods use hostNetwork.
const cniLoopback = `{"cniVersion": "1.0.0", "name": "loopback", "type": "loopback"}
`

// registryHosts is the hosts.toml of the node's registry, plain HTTP on
// loopback, and of each registry that it mirrors.
const registryHosts = `server = %[1]q

[host."http://%[2]s"]
  capabilities = ["pull", "resolve"]
`

// writeRegistryHosts writes containerd's registry configuration (its
// config_path) into dir: the node's registry over plain HTTP, and the
// mirror of each registry in mirrored.
func (n *node) writeRegistryHosts(dir string, mirrored []string) error {
	for _, host := range append([]string{n.registry.Host}, mirrored...) {
		server := "https://" + host
		if host == n.registry.Host {
			server = "http://" + host
		}
		if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
			return err
		}
		hosts := fmt.Sprintf(registryHosts, server, n.registry.Host)
		if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) startContainerd(ctx context.Context, c *Cluster, mirrored []string) error {
	dir := filepath.Join(n.dir, "containerd")
	cniConf := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	if err := n.writeCNIConfig(cniConf); err != nil {
		return err
	}
	certsDir := filepath.Join(dir, "certs.d")
	if err := n.writeRegistryHosts(certsDir, mirrored); err != nil {
		return err
	}
	config := fmt.Sprintf(containerdConfig,
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.socket, n.socket+".ttrpc",
		filepath.Join(dir, "opt"), PauseImage, cniBinDir, cniConf, n.bins.runc, filepath.Join(dir, "runc"), certsDir)
	configPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	var err error
	// containerd finds its shim on PATH.
	path := "PATH=" + filepath.Dir(n.bins.shim) + string(os.PathListSeparator) + os.Getenv("PATH")
	n.containerd, err = StartProcess("containerd", filepath.Join(c.Dir, "containerd.log"), []string{path},
		n.bins.containerd, "--config", configPath, "--log-level", "warn")
	if err != nil {
		return err
	}
	return c.poll(ctx, n.containerd, func(ctx context.Context) error {
		_, err := n.ctr(ctx, "version")
		return err
	})
}

// ctr runs containerd's client against the node's containerd, in the
// namespace of the kubelet's containers.
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.bins.ctr, append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// pushImages pushes the archives of opts.Images to the node's registry and
// returns the registries their names give (e.g. localhost,
// registry.k8s.io), which the registry mirrors for the node.
func (n *node) pushImages(ctx context.Context, opts *NodeOptions) ([]string, error) {
	n.registry = opts.Registry
	if n.registry == nil {
		var err error
		if n.registry, err = SharedRegistry(ctx); err != nil {
			return nil, err
		}
	}
	var mirrored []string
	for _, a := range opts.Images {
		p, err := n.registry.Push(ctx, a)
		if err != nil {
			return nil, err
		}
		host, _, _ := strings.Cut(p.Name, "/")
		if !slices.Contains(mirrored, host) && host != n.registry.Host {
			mirrored = append(mirrored, host)
		}
	}
	return mirrored, nil
}

// importPause makes the pause image and imports it: the node's sandbox
// image is there before any pod, as a node's is.
func (n *node) importPause(ctx context.Context) error {
	pause, err := n.pauseArchive(ctx)
	if err != nil {
		return err
	}
	_, err = n.ctr(ctx, "images", "import", pause)
	return err
}

// pauseArchive builds ./pause statically and packs it as PauseImage.
func (n *node) pauseArchive(ctx context.Context) (string, error) {
	bin := filepath.Join(n.dir, "pause")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin,
		"github.com/dnsops/k8s_event/internal/cluster/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the pause program: %w: %s", err, out)
	}
	archive := filepath.Join(n.dir, "pause.tar")
	f, err := os.Create(archive)
	if err != nil {
		return "", err
	}
	err = image.Write(f, PauseImage, image.Options{
		Binaries:   []image.Binary{{Platform: "linux/" + runtime.GOARCH, Path: bin}},
		Entrypoint: "/pause",
		Created:    time.Unix(0, 0),
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return archive, err
}

// kubeletConfig is the kubelet's configuration: it serves on loopback,
// trusts the cluster's CA and asks the API server who may do what, uses
// the cgroupfs driver on cgroup v1, leaves iptables and OOM scores alone,
// never garbage-collects images (the pause image cannot be pulled) and keeps its
// files under the node's directory where it lets itself be told.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %[1]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[2]d
tlsCertFile: %[3]q
tlsPrivateKeyFile: %[4]q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[5]q
authorization:
  mode: Webhook
containerRuntimeEndpoint: %[6]q
imageServiceEndpoint: %[6]q
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
makeIPTablesUtilChains: false
syncFrequency: %[7]s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
podLogsDirectory: %[8]q
volumePluginDir: %[9]q
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
resolvConf: %[10]q
`

func (c *Cluster) startKubelet(ctx context.Context, opts *NodeOptions, certs *pki) error {
	n := c.node
	kubeconfig, err := c.clientKubeconfig(certs, "kubelet-client", "system:node:"+n.name, "system:nodes")
	if err != nil {
		return err
	}
	servingCert, servingKey, err := certs.issueFiles("kubelet-serving", &x509.Certificate{
		Subject:     pkix.Name{CommonName: n.name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{n.name, "localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	healthz, err := FreePort()
	if err != nil {
		return err
	}
	sync := opts.SyncFrequency
	if sync == 0 {
		sync = 10 * time.Second
	}
	resolvConf, err := n.writeResolvConf()
	if err != nil {
		return err
	}
	config := fmt.Sprintf(kubeletConfig, port, healthz, servingCert, servingKey, certs.caFile,
		"unix://"+n.socket, sync, filepath.Join(n.dir, "pod-logs"), filepath.Join(n.dir, "volume-plugins"), resolvConf)
	configPath := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	n.kubelet, err = StartProcess("kubelet", filepath.Join(c.Dir, "kubelet.log"), nil, n.bins.kubelet,
		"--config="+configPath,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--v=1",
	)
	return err
}

// waitNodeReady waits until the node is registered and Ready.
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return c.poll(ctx, c.node.kubelet, func(ctx context.Context) error {
		node, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s: Ready=%s: %s", c.NodeName, cond.Status, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", c.NodeName)
	})
}

// stopNode stops the kubelet, every container it ran, containerd and its
// shims, the scheduler and the controller manager, each by its PID; then
// it undoes what they changed on the machine. It returns what it could
// not undo.
func (c *Cluster) stopNode() error {
	n := c.node
	if n == nil {
		return nil
	}
	// The kubelet first, or it starts again what is stopped next;
	// kube-proxy before its rules go.
	for _, p := range []*Process{n.kubelet, n.proxy, n.kcm, n.scheduler} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	var errs []error
	if n.machine != nil {
		errs = append(errs, n.machine.killContainers(10*time.Second))
	}
	if n.containerd != nil {
		n.containerd.Stop(10 * time.Second)
	}
	killShims(n.bins.shim, n.socket)
	if n.machine != nil {
		errs = append(errs, n.machine.restore(c.Dir))
	}
	if n.lock != nil {
		n.lock.Close() // releases the lock
	}
	return errors.Join(errs...)
}

// Port is the port of the API server on 127.0.0.1: what the pods of a node
// without a pod network need in KUBERNETES_SERVICE_PORT.
func (c *Cluster) Port() int {
	i := strings.LastIndexByte(c.server, ':')
	p, _ := strconv.Atoi(c.server[i+1:])
	return p
}

// KubeletLog returns the last n lines that the kubelet wrote.
func (c *Cluster) KubeletLog(n int) string {
	if c.node == nil || c.node.kubelet == nil {
		return ""
	}
	return c.node.kubelet.LogTail(n)
}
