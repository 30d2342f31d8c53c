package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const contextName = "lockstep"

// writeKubeconfig writes a self-contained kubeconfig (certificates inlined) for one
// client identity.
func writeKubeconfig(path, server string, caPEM []byte, client *keyPair) error {
	kpem, err := keyPEM(client.key)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[contextName] = &clientcmdapi.Cluster{
		Server:                   server,
		CertificateAuthorityData: caPEM,
	}
	cfg.AuthInfos[contextName] = &clientcmdapi.AuthInfo{
		ClientCertificateData: client.certPEM(),
		ClientKeyData:         kpem,
	}
	cfg.Contexts[contextName] = &clientcmdapi.Context{Cluster: contextName, AuthInfo: contextName}
	cfg.CurrentContext = contextName
	return clientcmd.WriteToFile(*cfg, path)
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// runKubeconfig mints a client certificate for --user/--group, signed by the CA of the
// control plane in --dir, and writes a kubeconfig for it.
func runKubeconfig(args []string) int {
	fs := flag.NewFlagSet("kubeconfig", flag.ContinueOnError)
	dir := fs.String("dir", "", "the control plane's directory (required)")
	user := fs.String("user", "", "user name (certificate CommonName; required)")
	out := fs.String("out", "", "where to write the kubeconfig (required)")
	var groups stringList
	fs.Var(&groups, "group", "group (certificate Organization); repeatable")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *user == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "kubeconfig: --dir, --user and --out are required")
		return 2
	}
	if err := mintKubeconfig(*dir, *user, groups, *out); err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v\n", err)
		return 1
	}
	return 0
}

func mintKubeconfig(dir, user string, groups []string, out string) error {
	admin, err := clientcmd.LoadFromFile(filepath.Join(dir, adminKubeconfigName))
	if err != nil {
		return err
	}
	cluster, ok := admin.Clusters[contextName]
	if !ok {
		return errors.New("admin kubeconfig has no cluster " + contextName)
	}
	ca, err := loadCA(filepath.Join(dir, pkiDirName))
	if err != nil {
		return err
	}
	client, err := ca.issue(certSpec{commonName: user, groups: groups, client: true})
	if err != nil {
		return err
	}
	return writeKubeconfig(out, cluster.Server, cluster.CertificateAuthorityData, client)
}
