package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files kube-apiserver needs: a CA that signs both the serving
// certificate and the admin client certificate, and the key that signs
// ServiceAccount tokens.
type pki struct {
	caCert      []byte // PEM
	servingCert string // file paths
	servingKey  string
	caFile      string
	saKey       string
	saPub       string
	adminCert   []byte // PEM
	adminKey    []byte // PEM

	dir   string
	ca    *x509.Certificate
	caKey crypto.Signer
}

// servingIPs are the API server's addresses: loopback for the tests'
// clients; the kubernetes Service's address and the one behind it for a
// node's pods.
var servingIPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP(apiServiceIP), net.ParseIP(APIHostAddress)}

// newCA makes the cluster's certificate authority, valid for a day.
func newCA() (*x509.Certificate, []byte, crypto.Signer, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "k8s_event-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, caDER, caKey, nil
}

func newPKI(dir string) (*pki, error) {
	ca, caDER, caKey, err := newCA()
	if err != nil {
		return nil, err
	}
	servingCert, servingKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: servingIPs,
	})
	if err != nil {
		return nil, err
	}
	// Membership in system:masters makes the admin a cluster superuser
	// whatever RBAC says.
	adminCert, adminKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}

	p := &pki{
		caCert:      pemBlock("CERTIFICATE", caDER),
		caFile:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saKey:       filepath.Join(dir, "sa.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		adminCert:   adminCert,
		adminKey:    adminKey,
		dir:         dir,
		ca:          ca,
		caKey:       caKey,
	}
	for path, data := range map[string][]byte{
		p.caFile:      p.caCert,
		p.servingCert: servingCert,
		p.servingKey:  servingKey,
		p.saKey:       saKeyPEM,
		p.saPub:       pemBlock("PUBLIC KEY", saPubDER),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// issue signs tmpl with the CA and returns the PEM certificate and key.
func issue(ca *x509.Certificate, caKey crypto.Signer, tmpl *x509.Certificate) (certPEM, keyPEMData []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = ca.NotBefore
	tmpl.NotAfter = ca.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", tmpl.Subject.CommonName, err)
	}
	keyData, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyData, nil
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// issueFiles signs tmpl with the CA and writes NAME.crt and NAME.key into
// the PKI's directory; it returns their paths.
func (p *pki) issueFiles(name string, tmpl *x509.Certificate) (certFile, keyFile string, err error) {
	cert, key, err := issue(p.ca, p.caKey, tmpl)
	if err != nil {
		return "", "", err
	}
	certFile = filepath.Join(p.dir, name+".crt")
	keyFile = filepath.Join(p.dir, name+".key")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, key, 0o600)
}

// client is a client certificate's subject: the user and its groups.
func client(user string, groups ...string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}
