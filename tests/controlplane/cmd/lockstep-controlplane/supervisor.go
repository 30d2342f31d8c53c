package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Names inside the control plane's directory; the Python side (lockstep_dev.localcluster)
// reads ready.json and nothing else, so these may change together with this file.
const (
	pkiDirName                  = "pki"
	adminKubeconfigName         = "admin.kubeconfig"
	controllerManagerConfigName = "controller-manager.kubeconfig"
	schedulerConfigName         = "scheduler.kubeconfig"
	readyFileName               = "ready.json"
	serviceClusterIPRange       = "10.0.0.0/24"
	serviceClusterAPIAddress    = "10.0.0.1" // first address of serviceClusterIPRange
	serviceAccountIssuer        = "https://kubernetes.default.svc.cluster.local"
	frontProxyClientName        = "front-proxy-client"
)

// defaultAuditPolicy records who did what to which object, without bodies.
const defaultAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

type supervisorOptions struct {
	dir            string
	keepDir        bool
	exitWithParent bool
	apiserverPort  int
	auditLog       string
	auditPolicy    string
	etcdFsync      bool
	verbosity      int
	readyTimeout   time.Duration
	stopTimeout    time.Duration
	crds           stringList
	apiserverArgs  stringList
	controllerArgs stringList
	schedulerArgs  stringList
}

func parseSupervisorFlags(args []string) (*supervisorOptions, error) {
	o := &supervisorOptions{}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "", "directory for certificates, kubeconfigs, etcd data and logs "+
		"(default: a new temporary directory, removed on exit)")
	fs.BoolVar(&o.keepDir, "keep-dir", false, "keep the temporary directory on exit")
	fs.BoolVar(&o.exitWithParent, "exit-with-parent", false, "stop when the process that started "+
		"this one exits (a test runner killed with SIGKILL leaves nothing behind)")
	fs.IntVar(&o.apiserverPort, "apiserver-port", 0, "kube-apiserver port on 127.0.0.1 (0: a free port)")
	fs.StringVar(&o.auditLog, "audit-log", "", "write the API server's audit log to this file")
	fs.StringVar(&o.auditPolicy, "audit-policy", "", "audit policy file (default: Metadata for every request)")
	fs.BoolVar(&o.etcdFsync, "etcd-fsync", false, "fsync etcd's writes (off: the data is throw-away and "+
		"fsync dominates write latency)")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity of the Kubernetes components")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 120*time.Second, "give up when not ready by then")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 10*time.Second, "per component, before SIGKILL")
	fs.Var(&o.crds, "crd", "install the CustomResourceDefinitions in this YAML file before the "+
		"controllers start; repeatable")
	fs.Var(&o.apiserverArgs, "apiserver-arg", "extra kube-apiserver flag (--name=value); repeatable")
	fs.Var(&o.controllerArgs, "controller-manager-arg", "extra kube-controller-manager flag; repeatable")
	fs.Var(&o.schedulerArgs, "scheduler-arg", "extra kube-scheduler flag; repeatable")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

// readyInfo is what the supervisor prints (one JSON line) and writes to ready.json.
type readyInfo struct {
	Server            string         `json:"server"`
	Kubeconfig        string         `json:"kubeconfig"`
	CAFile            string         `json:"caFile"`
	ClientCert        string         `json:"clientCert"` // the admin's, as in the kubeconfig
	ClientKey         string         `json:"clientKey"`
	Dir               string         `json:"dir"`
	LogDir            string         `json:"logDir"`
	Etcd              string         `json:"etcd"`
	AuditLog          string         `json:"auditLog,omitempty"`
	KubernetesVersion string         `json:"kubernetesVersion"`
	PID               int            `json:"pid"`
	Components        map[string]int `json:"components"`
	StartSeconds      float64        `json:"startSeconds"`
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lockstep-controlplane: "+format+"\n", args...)
}

func runSupervisor(args []string) int {
	o, err := parseSupervisorFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		logf("%v", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.exitWithParent {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go watchParent(ctx, cancel)
	}

	removeDir := false
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "lockstep-controlplane-"); err != nil {
			logf("%v", err)
			return 1
		}
		removeDir = !o.keepDir
	}
	if o.dir, err = filepath.Abs(o.dir); err != nil {
		logf("%v", err)
		return 1
	}
	s := &supervisor{opts: o, started: time.Now()}
	code := s.run(ctx)
	if removeDir {
		if err := os.RemoveAll(o.dir); err != nil {
			logf("removing %s: %v", o.dir, err)
		}
	}
	return code
}

// watchParent cancels when this process is re-parented, i.e. its parent died.
func watchParent(ctx context.Context, cancel context.CancelFunc) {
	parent := os.Getppid()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if os.Getppid() != parent {
				logf("parent process %d exited", parent)
				cancel()
				return
			}
		}
	}
}

type supervisor struct {
	opts     *supervisorOptions
	started  time.Time
	etcd     *embed.Etcd
	children []*child // in start order; stopped in reverse
	exited   chan *child
}

// phase logs how far into the start a milestone was reached.
func (s *supervisor) phase(what string) {
	logf("%s after %.1fs", what, time.Since(s.started).Seconds())
}

func (s *supervisor) path(parts ...string) string {
	return filepath.Join(append([]string{s.opts.dir}, parts...)...)
}

func (s *supervisor) run(ctx context.Context) int {
	s.exited = make(chan *child, 4)
	defer s.shutdown()
	info, err := s.start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			logf("interrupted while starting")
			return 1
		}
		logf("start failed: %v (logs in %s)", err, s.path("logs"))
		return 1
	}
	line, err := json.Marshal(info)
	if err != nil {
		logf("%v", err)
		return 1
	}
	// Written atomically so a reader never sees half a file.
	tmp := s.path(readyFileName + ".tmp")
	if err := os.WriteFile(tmp, append(line, '\n'), 0o644); err != nil {
		logf("%v", err)
		return 1
	}
	if err := os.Rename(tmp, s.path(readyFileName)); err != nil {
		logf("%v", err)
		return 1
	}
	fmt.Println(string(line))
	logf("ready in %.1fs: %s (kubeconfig %s)", info.StartSeconds, info.Server, info.Kubeconfig)

	select {
	case <-ctx.Done():
		logf("stopping")
		return 0
	case c := <-s.exited:
		logf("%s exited unexpectedly: %v (log: %s)", c.name, c.err, c.logPath)
		return 1
	case err := <-s.etcd.Err():
		logf("etcd failed: %v", err)
		return 1
	}
}

type ports struct {
	apiserver, etcdClient, etcdPeer, controllerManager, scheduler int
}

// freePorts asks the kernel for n distinct free ports on 127.0.0.1 (all listeners are
// held open together so no two coincide).
func freePorts(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func (s *supervisor) start(ctx context.Context) (*readyInfo, error) {
	o := s.opts
	for _, d := range []string{s.path(pkiDirName), s.path("logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// Read the CRDs first: a bad file fails before anything starts.
	crds, err := readCRDs(o.crds)
	if err != nil {
		return nil, err
	}
	// The control plane is throw-away: a reused --dir never resurrects an old cluster
	// (whose service-account tokens the new keys could not verify).
	if err := os.RemoveAll(s.path("etcd")); err != nil {
		return nil, err
	}
	free, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	p := ports{free[0], free[1], free[2], free[3], free[4]}
	if o.apiserverPort != 0 {
		p.apiserver = o.apiserverPort
	}
	server := "https://127.0.0.1:" + strconv.Itoa(p.apiserver)

	ca, err := s.writePKI(server)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	caPool := x509.NewCertPool()
	caPool.AddCert(ca.cert)

	etcdURL, err := s.startEtcd(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	s.phase("etcd ready")

	apiArgs, err := s.apiserverFlags(p, etcdURL)
	if err != nil {
		return nil, err
	}
	if err := s.startChild("kube-apiserver", apiArgs); err != nil {
		return nil, err
	}
	deadline, cancel := context.WithTimeout(ctx, o.readyTimeout)
	defer cancel()
	admin, err := tlsClient(caPool, s.path(pkiDirName, "admin.crt"), s.path(pkiDirName, "admin.key"))
	if err != nil {
		return nil, err
	}
	if err := s.waitOK(deadline, admin, server+"/readyz"); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	s.phase("kube-apiserver ready")
	if len(crds) > 0 {
		if err := s.installCRDs(deadline, crds); err != nil {
			return nil, err
		}
		s.phase(fmt.Sprintf("%d CRDs established", len(crds)))
	}
	if err := s.startChild("kube-controller-manager", s.controllerManagerFlags(p)); err != nil {
		return nil, err
	}
	if err := s.startChild("kube-scheduler", s.schedulerFlags(p)); err != nil {
		return nil, err
	}
	anon, err := tlsClient(caPool, "", "")
	if err != nil {
		return nil, err
	}
	checks := []struct{ name, url string }{
		{"kube-controller-manager", "https://127.0.0.1:" + strconv.Itoa(p.controllerManager) + "/healthz"},
		{"kube-scheduler", "https://127.0.0.1:" + strconv.Itoa(p.scheduler) + "/healthz"},
	}
	for _, c := range checks {
		if err := s.waitOK(deadline, anon, c.url); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		s.phase(c.name + " healthy")
	}
	// The controllers run once the service-account controller has filled in the default
	// namespace: pods cannot be admitted anywhere before that.
	if err := s.waitOK(deadline, admin, server+"/api/v1/namespaces/default/serviceaccounts/default"); err != nil {
		return nil, fmt.Errorf("kube-controller-manager controllers: %w", err)
	}

	pids := map[string]int{}
	for _, c := range s.children {
		pids[c.name] = c.cmd.Process.Pid
	}
	return &readyInfo{
		Server:            server,
		Kubeconfig:        s.path(adminKubeconfigName),
		CAFile:            s.path(pkiDirName, "ca.crt"),
		ClientCert:        s.path(pkiDirName, "admin.crt"),
		ClientKey:         s.path(pkiDirName, "admin.key"),
		Dir:               o.dir,
		LogDir:            s.path("logs"),
		Etcd:              etcdURL,
		AuditLog:          o.auditLog,
		KubernetesVersion: kubernetesVersion(),
		PID:               os.Getpid(),
		Components:        pids,
		StartSeconds:      time.Since(s.started).Seconds(),
	}, nil
}

// writePKI creates the cluster CA, every certificate the components need, the
// service-account signing key and one kubeconfig per client.
func (s *supervisor) writePKI(server string) (*keyPair, error) {
	dir := s.path(pkiDirName)
	ca, err := newCA("lockstep-controlplane-ca")
	if err != nil {
		return nil, err
	}
	if err := ca.write(dir, "ca"); err != nil {
		return nil, err
	}
	apiserverHosts := []string{
		"127.0.0.1", "::1", "localhost", serviceClusterAPIAddress,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local",
	}
	leaves := []struct {
		name string
		spec certSpec
	}{
		{"apiserver", certSpec{commonName: "kube-apiserver", hosts: apiserverHosts}},
		{"components-serving", certSpec{commonName: "localhost", hosts: []string{"127.0.0.1", "localhost"}}},
		// The API server's identity towards kubelets (logs, exec, port-forward).
		{"apiserver-kubelet-client", certSpec{
			commonName: "kube-apiserver-kubelet-client", groups: []string{"system:masters"}, client: true,
		}},
		{"admin", certSpec{commonName: "lockstep-admin", groups: []string{"system:masters"}, client: true}},
		// The identities the RBAC bootstrap policy grants the two components.
		{"controller-manager", certSpec{commonName: "system:kube-controller-manager", client: true}},
		{"scheduler", certSpec{commonName: "system:kube-scheduler", client: true}},
	}
	// A second CA for the aggregation layer's front proxy, as kubeadm sets it up: the
	// controller manager and the scheduler read it to authenticate delegated requests,
	// and aggregated API servers need it.
	frontProxyCA, err := newCA("lockstep-front-proxy-ca")
	if err != nil {
		return nil, err
	}
	if err := frontProxyCA.write(dir, "front-proxy-ca"); err != nil {
		return nil, err
	}
	frontProxyClient, err := frontProxyCA.issue(certSpec{commonName: frontProxyClientName, client: true})
	if err != nil {
		return nil, err
	}
	if err := frontProxyClient.write(dir, "front-proxy-client"); err != nil {
		return nil, err
	}
	issued := map[string]*keyPair{}
	for _, l := range leaves {
		kp, err := ca.issue(l.spec)
		if err != nil {
			return nil, err
		}
		if err := kp.write(dir, l.name); err != nil {
			return nil, err
		}
		issued[l.name] = kp
	}
	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	saPriv, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	saPub, err := publicKeyPEM(saKey.Public())
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), saPriv, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), saPub, 0o644); err != nil {
		return nil, err
	}
	kubeconfigs := map[string]string{
		adminKubeconfigName:         "admin",
		controllerManagerConfigName: "controller-manager",
		schedulerConfigName:         "scheduler",
	}
	for file, identity := range kubeconfigs {
		if err := writeKubeconfig(s.path(file), server, ca.certPEM(), issued[identity]); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

func (s *supervisor) startEtcd(ctx context.Context, p ports) (string, error) {
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(p.etcdClient)}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(p.etcdPeer)}
	cfg := embed.NewConfig()
	cfg.Name = "lockstep"
	cfg.Dir = s.path("etcd")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = !s.opts.etcdFsync
	// One member has no peers to wait for: short ticks make it elect itself at once.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{s.path("logs", "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", err
	}
	s.etcd = e
	select {
	case <-e.Server.ReadyNotify():
		return clientURL.String(), nil
	case err := <-e.Err():
		return "", err
	case <-time.After(s.opts.readyTimeout):
		return "", errors.New("not ready in time")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (s *supervisor) apiserverFlags(p ports, etcdURL string) ([]string, error) {
	pki := func(name string) string { return s.path(pkiDirName, name) }
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(p.apiserver),
		"--cert-dir=" + s.path(pkiDirName),
		"--tls-cert-file=" + pki("apiserver.crt"),
		"--tls-private-key-file=" + pki("apiserver.key"),
		"--client-ca-file=" + pki("ca.crt"),
		"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + pki("sa.pub"),
		"--service-account-signing-key-file=" + pki("sa.key"),
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		// Endpoints may not hold loopback addresses, so the API server cannot publish
		// itself behind the `kubernetes` Service; local clients use 127.0.0.1 directly.
		"--endpoint-reconciler-type=none",
		"--requestheader-client-ca-file=" + pki("front-proxy-ca.crt"),
		"--requestheader-allowed-names=" + frontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + pki("front-proxy-client.crt"),
		"--proxy-client-key-file=" + pki("front-proxy-client.key"),
		// RBAC as in production (least-privilege checks rely on it); Node for kubelets.
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=" + strconv.Itoa(s.opts.verbosity),
	}
	if s.opts.auditLog != "" {
		policy := s.opts.auditPolicy
		if policy == "" {
			policy = s.path("audit-policy.yaml")
			if err := os.WriteFile(policy, []byte(defaultAuditPolicy), 0o644); err != nil {
				return nil, err
			}
		}
		args = append(args, "--audit-log-path="+s.opts.auditLog, "--audit-policy-file="+policy)
	}
	return append(args, s.opts.apiserverArgs...), nil
}

func (s *supervisor) controllerManagerFlags(p ports) []string {
	pki := func(name string) string { return s.path(pkiDirName, name) }
	kubeconfig := s.path(controllerManagerConfigName)
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(p.controllerManager),
		"--tls-cert-file=" + pki("components-serving.crt"),
		"--tls-private-key-file=" + pki("components-serving.key"),
		"--leader-elect=false",
		// Client-side rate limits sized for a shared production API server (20 QPS) spend
		// seconds of start-up queueing the per-controller token requests; a private,
		// local API server does not need them.
		"--kube-api-qps=500",
		"--kube-api-burst=1000",
		// Each controller acts as its own service account, as kubeadm sets it up, so the
		// RBAC bootstrap roles are exercised as in production.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki("sa.key"),
		"--root-ca-file=" + pki("ca.crt"),
		"--cluster-signing-cert-file=" + pki("ca.crt"),
		"--cluster-signing-key-file=" + pki("ca.key"),
		"--profiling=false",
		"--v=" + strconv.Itoa(s.opts.verbosity),
	}
	return append(args, s.opts.controllerArgs...)
}

func (s *supervisor) schedulerFlags(p ports) []string {
	pki := func(name string) string { return s.path(pkiDirName, name) }
	kubeconfig := s.path(schedulerConfigName)
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(p.scheduler),
		"--tls-cert-file=" + pki("components-serving.crt"),
		"--tls-private-key-file=" + pki("components-serving.key"),
		"--leader-elect=false",
		"--profiling=false",
		"--v=" + strconv.Itoa(s.opts.verbosity),
	}
	return append(args, s.opts.schedulerArgs...)
}

type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// startChild runs one component as `<this binary> <name> <args>` with its output in
// logs/<name>.log.
func (s *supervisor) startChild(name string, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := s.path("logs", name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	s.children = append(s.children, c)
	go func() {
		c.err = cmd.Wait()
		_ = logFile.Close()
		close(c.done)
		s.exited <- c
	}()
	return nil
}

func tlsClient(caPool *x509.CertPool, certFile, keyFile string) (*http.Client, error) {
	cfg := &tls.Config{RootCAs: caPool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: cfg},
	}, nil
}

// waitOK polls url until it answers 200, a component exits, or ctx ends.
func (s *supervisor) waitOK(ctx context.Context, client *http.Client, target string) error {
	var last string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(target)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		select {
		case c := <-s.exited:
			return fmt.Errorf("%s exited: %v (log: %s)", c.name, c.err, c.logPath)
		case <-ctx.Done():
			return fmt.Errorf("%s not OK in time; last answer: %s", target, last)
		case <-tick.C:
		}
	}
}

// shutdown stops the components in reverse start order (SIGTERM, then SIGKILL after
// stopTimeout), then etcd.
func (s *supervisor) shutdown() {
	var wg sync.WaitGroup
	// The scheduler and the controller manager do not depend on each other.
	for i := len(s.children) - 1; i >= 0; i-- {
		c := s.children[i]
		if c.name == "kube-apiserver" {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.stopChild(c) }()
	}
	wg.Wait()
	for _, c := range s.children {
		if c.name == "kube-apiserver" {
			s.stopChild(c)
		}
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
}

func (s *supervisor) stopChild(c *child) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(s.opts.stopTimeout):
		logf("%s did not stop in %s; killing it", c.name, s.opts.stopTimeout)
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// kubernetesVersion is the version of the k8s.io/kubernetes module this binary was
// built from.
func kubernetesVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}
