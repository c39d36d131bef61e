// Package cluster runs a real Kubernetes for the end-to-end tests, the
// benchmarks and the demo: etcd and kube-apiserver on free loopback ports,
// with TLS, RBAC and ServiceAccount tokens; and, when asked and the machine
// allows (Linux, root), a node: containerd and runc, a kubelet,
// kube-controller-manager and kube-scheduler, on which Pods run. Without a
// node, Pods are stored and never run; they exist to be the object that
// events refer to.
//
// The binaries come from the environment variables KUBE_APISERVER, ETCD and
// KUBECTL (and for a node KUBELET, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER,
// CONTAINERD, CONTAINERD_SHIM and CTR), as printed by hack/tools.sh env.
// Stop stops every process by its PID and undoes what the node changed on
// the machine.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// Options change how the control plane starts.
type Options struct {
	// APIServerFlags are added to the kube-apiserver command line, e.g.
	// "--enable-admission-plugins=EventRateLimit".
	APIServerFlags []string
	// AdmissionConfig, when not empty, is an AdmissionConfiguration (YAML)
	// written to a file and passed as --admission-control-config-file.
	AdmissionConfig string
	// AuditPolicy, when not empty, is an audit Policy (YAML); the API
	// server then writes its audit log to Cluster.AuditLogPath.
	AuditPolicy string
	// Node, when not nil, starts a node; see NodeSupported.
	Node *NodeOptions
	// StartTimeout bounds the wait for etcd and kube-apiserver to be ready;
	// two minutes when zero.
	StartTimeout time.Duration
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Clientset is authenticated as a member of system:masters.
	Clientset *kubernetes.Clientset
	// RESTConfig is the admin configuration behind Clientset.
	RESTConfig *rest.Config
	// KubeconfigPath is an admin kubeconfig with embedded credentials.
	KubeconfigPath string
	// Dir holds the data, certificates, kubeconfigs and logs.
	Dir string
	// AuditLogPath is the API server's audit log, when there is a policy.
	AuditLogPath string
	// NodeName is the node's name, when there is a node.
	NodeName string

	kubectl   string
	server    string
	etcdURL   string
	caPEM     []byte
	etcd      *Process
	apiserver *Process
	node      *node
	stopOnce  sync.Once
}

// binaries reads the paths of the binaries from the environment.
func binaries() (apiserver, etcd, kubectl string, err error) {
	get := func(name string) string {
		path := os.Getenv(name)
		if path == "" {
			err = errors.Join(err, fmt.Errorf("%s is not set: run the tests with 'make test-e2e', or export the output of 'hack/tools.sh env'", name))
			return ""
		}
		if _, statErr := os.Stat(path); statErr != nil {
			err = errors.Join(err, fmt.Errorf("%s=%s: %w", name, path, statErr))
		}
		return path
	}
	return get("KUBE_APISERVER"), get("ETCD"), get("KUBECTL"), err
}

// New starts etcd and kube-apiserver and waits until the API server is ready.
// Stop the cluster with Stop.
func New(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	apiserverBin, etcdBin, kubectlBin, err := binaries()
	if err != nil {
		return nil, err
	}
	// Ports are picked before the servers bind them; another process may
	// take one in between. Then start over with new ports.
	for attempt := 1; ; attempt++ {
		c := &Cluster{kubectl: kubectlBin}
		err := c.start(ctx, opts, apiserverBin, etcdBin)
		if err == nil {
			return c, nil
		}
		c.Stop()
		if !errors.Is(err, errAddrInUse) || attempt == 3 {
			return nil, err
		}
	}
}

// NewForTest is New for a test: it fails tb when the cluster does not start
// and stops the cluster in tb's cleanup.
func NewForTest(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(tb.Context(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

func (c *Cluster) start(ctx context.Context, opts Options, apiserverBin, etcdBin string) error {
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "k8s_event-cluster-")
	if err != nil {
		return err
	}
	c.Dir = dir
	certs, err := newPKI(dir)
	if err != nil {
		return fmt.Errorf("generate certificates: %w", err)
	}
	c.caPEM = certs.caCert

	etcdURL, err := c.startEtcd(ctx, etcdBin)
	if err != nil {
		return err
	}

	args, err := c.apiServerArgs(opts, dir, etcdURL, certs)
	if err != nil {
		return err
	}
	c.apiserver, err = StartProcess("kube-apiserver", filepath.Join(dir, "kube-apiserver.log"), nil, apiserverBin, args...)
	if err != nil {
		return err
	}

	if err := c.writeAdminKubeconfig(certs); err != nil {
		return err
	}
	c.RESTConfig, err = clientcmd.BuildConfigFromFlags("", c.KubeconfigPath)
	if err != nil {
		return err
	}
	c.RESTConfig.QPS, c.RESTConfig.Burst = 100, 200
	c.Clientset, err = kubernetes.NewForConfig(c.RESTConfig)
	if err != nil {
		return err
	}
	if err := c.waitReady(ctx); err != nil {
		return err
	}
	if opts.Node != nil {
		return c.startNode(ctx, opts.Node, certs)
	}
	return nil
}

// apiServerArgs gives kube-apiserver's flags: its port (c.server), etcd,
// the certificates, and what opts add (admission, audit, the node's flags).
func (c *Cluster) apiServerArgs(opts Options, dir, etcdURL string, certs *pki) ([]string, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	c.server = "https://127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servingKey,
		"--client-ca-file=" + certs.caFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + certs.saPub,
		"--service-account-signing-key-file=" + certs.saKey,
		"--service-cluster-ip-range=" + ServiceCIDR, // kubeadm's: kube-dns is 10.96.0.10
		"--authorization-mode=Node,RBAC",
		"--profiling=false",
		"--v=1",
	}
	args = append(args, apiServerAddressFlags(opts)...)
	if opts.AdmissionConfig != "" {
		path := filepath.Join(dir, "admission.yaml")
		if err := os.WriteFile(path, []byte(opts.AdmissionConfig), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--admission-control-config-file="+path)
	}
	if opts.AuditPolicy != "" {
		path := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(path, []byte(opts.AuditPolicy), 0o600); err != nil {
			return nil, err
		}
		c.AuditLogPath = filepath.Join(dir, "audit.log")
		args = append(args, "--audit-policy-file="+path, "--audit-log-path="+c.AuditLogPath)
	}
	if opts.Node != nil {
		flags, err := nodeAPIServerFlags(certs)
		if err != nil {
			return nil, err
		}
		args = append(args, flags...)
	}
	args = append(args, opts.APIServerFlags...)
	return args, nil
}

func (c *Cluster) startEtcd(ctx context.Context, bin string) (string, error) {
	clientPort, err := FreePort()
	if err != nil {
		return "", err
	}
	peerPort, err := FreePort()
	if err != nil {
		return "", err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd, err = StartProcess("etcd", filepath.Join(c.Dir, "etcd.log"), nil, bin,
		"--name=e2e",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL,
		// The data dies with the test: durability buys nothing.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return "", err
	}
	c.etcdURL = clientURL
	err = c.poll(ctx, c.etcd, func(ctx context.Context) error {
		body, err := HTTPGet(ctx, clientURL+"/health")
		if err == nil && !strings.Contains(body, `"health":"true"`) {
			err = fmt.Errorf("etcd /health: %s", body)
		}
		return err
	})
	return clientURL, err
}

func (c *Cluster) waitReady(ctx context.Context) error {
	return c.poll(ctx, c.apiserver, func(ctx context.Context) error {
		body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("kube-apiserver /readyz: %w: %s", err, body)
		}
		// The namespace that the bootstrap controller makes last.
		_, err = c.Clientset.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		return err
	})
}

// poll calls check every 100ms until it succeeds, p exits or ctx ends.
func (c *Cluster) poll(ctx context.Context, p *Process, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("%s exited: %v", p.Name, p.waitErr)
		}
		last = check(ctx)
		return last == nil, nil
	})
	if err == nil {
		return nil
	}
	if p.Exited() && strings.Contains(p.Log(), "address already in use") {
		return fmt.Errorf("%s: %w", p.Name, errAddrInUse)
	}
	return fmt.Errorf("%s not ready: %v (last check: %v)\n--- last lines of %s ---\n%s",
		p.Name, err, last, p.LogPath, p.LogTail(40))
}

func (c *Cluster) writeAdminKubeconfig(certs *pki) error {
	c.KubeconfigPath = filepath.Join(c.Dir, "admin.kubeconfig")
	return c.writeKubeconfig(c.KubeconfigPath, "admin", &clientcmdapi.AuthInfo{
		ClientCertificateData: certs.adminCert,
		ClientKeyData:         certs.adminKey,
	})
}

func (c *Cluster) writeKubeconfig(path, user string, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: c.server, CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

// Stop stops the node, kube-apiserver and etcd by their PIDs, undoes what
// the node changed on the machine and removes Dir. It is safe to call more
// than once; what it could not undo it prints.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		if err := c.stopNode(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: the node left something behind: %v\n", err)
		}
		for _, p := range []*Process{c.apiserver, c.etcd} {
			if p != nil {
				p.Stop(10 * time.Second)
			}
		}
		if c.Dir != "" {
			os.RemoveAll(c.Dir)
		}
	})
}

// APIServerLog returns the last n lines that kube-apiserver wrote.
func (c *Cluster) APIServerLog(n int) string { return c.apiserver.LogTail(n) }

// Kubectl runs the built kubectl against the cluster with the admin
// kubeconfig.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	return c.KubectlAs(ctx, c.KubeconfigPath, args...)
}

// KubectlAs runs kubectl with the given kubeconfig.
func (c *Cluster) KubectlAs(ctx context.Context, kubeconfig string, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{
		"--kubeconfig=" + kubeconfig,
		"--cache-dir=" + filepath.Join(c.Dir, "kubectl-cache"),
	}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=", "NO_COLOR=1")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), errOut.String(), err
}

// CreateNamespace creates a namespace and its default ServiceAccount, which
// the controller-manager would otherwise make and Pods need.
func (c *Cluster) CreateNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns, err := c.Clientset.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := c.ensureServiceAccount(ctx, name, "default"); err != nil {
		return nil, err
	}
	return ns, nil
}

func (c *Cluster) ensureServiceAccount(ctx context.Context, ns, name string) error {
	_, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// CreatePod creates a Pod that is never scheduled: it exists to have a name
// and a UID that events can refer to. The namespace's default ServiceAccount,
// which admission requires, is created when missing.
func (c *Cluster) CreatePod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if err := c.ensureServiceAccount(ctx, ns, "default"); err != nil {
		return nil, err
	}
	return c.Clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"k8s-app": "coredns"}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name:  "coredns",
				Image: "example.com/coredns-k8s-event:latest",
			}},
		},
	}, metav1.CreateOptions{})
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the
// ServiceAccount ns/name with a token from the TokenRequest API, creating
// the ServiceAccount when it does not exist. It returns the file's path.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, ns, name string) (string, error) {
	if err := c.ensureServiceAccount(ctx, ns, name); err != nil {
		return "", err
	}
	tr, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for serviceaccount %s/%s: %w", ns, name, err)
	}
	path := filepath.Join(c.Dir, fmt.Sprintf("sa-%s-%s.kubeconfig", ns, name))
	user := "system:serviceaccount:" + ns + ":" + name
	return path, c.writeKubeconfig(path, user, &clientcmdapi.AuthInfo{Token: tr.Status.Token})
}

// MetricsText returns kube-apiserver's /metrics in the Prometheus text
// format.
func (c *Cluster) MetricsText(ctx context.Context) (string, error) {
	b, err := c.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(b), err
}

// EtcdMetricsText returns etcd's /metrics in the Prometheus text format.
func (c *Cluster) EtcdMetricsText(ctx context.Context) (string, error) {
	return HTTPGet(ctx, c.etcdURL+"/metrics")
}

// ControlPlanePIDs returns the process IDs of kube-apiserver and etcd, to
// read what CPU they used.
func (c *Cluster) ControlPlanePIDs() (apiserver, etcd int) {
	return c.apiserver.Pid(), c.etcd.Pid()
}

// HTTPGet returns the body of url, or an error when the status is not 200.
func HTTPGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), err
}
