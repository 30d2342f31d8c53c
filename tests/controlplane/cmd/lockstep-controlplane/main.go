// Command lockstep-controlplane runs a real, single-node Kubernetes control plane on
// 127.0.0.1 for lockstep's tests and its local cluster: embedded etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, all built from Kubernetes' own Go modules.
//
// With no subcommand (or `run`) it is the supervisor: it generates certificates, keys and
// kubeconfigs into a directory, starts etcd in its own process, re-executes itself once per
// Kubernetes component (each component keeps its upstream flags, globals and signal
// handling, as in a real cluster), waits until every component is healthy and then prints
// one JSON line (also written to <dir>/ready.json) that says where everything is. SIGTERM
// or SIGINT stops the components in reverse order and then etcd.
//
// `kubeconfig` mints a client certificate for any user and groups, signed by the cluster's
// CA, so tests can act as a least-privileged identity.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream mains do
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream mains do
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// Component subcommands: the supervisor runs each one as a child process of this binary.
var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

const usage = `usage:
  lockstep-controlplane [run] [flags]        start the control plane (see run --help)
  lockstep-controlplane kubeconfig [flags]   mint a client kubeconfig for a user
  lockstep-controlplane kube-apiserver|kube-controller-manager|kube-scheduler [flags]
                                             run one upstream component (used by run)
  lockstep-controlplane version
`

func main() {
	args := os.Args[1:]
	sub := "run"
	if len(args) > 0 && (args[0] == "" || args[0][0] != '-') {
		sub, args = args[0], args[1:]
	}
	if newCommand, ok := components[sub]; ok {
		// Build only the command that runs: kube-apiserver installs its signal handler
		// when its command is constructed.
		cmd := newCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	}
	switch sub {
	case "run":
		os.Exit(runSupervisor(args))
	case "kubeconfig":
		os.Exit(runKubeconfig(args))
	case "version":
		fmt.Println(kubernetesVersion())
	case "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n%s", sub, usage)
		os.Exit(2)
	}
}
