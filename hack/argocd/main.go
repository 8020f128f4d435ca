// argocd: Argo CD's own application controller and repo server (argo-cd/v3, the version pinned
// in go.mod), for running Argo CD as local processes beside the control plane
// (localenv/argocd.py). Built and cached by hack/build-tools.sh argocd, keyed by a hash of this
// directory.
//
// This is Argo CD's cmd/main.go cut down to the commands a sync needs: the multi-call binary
// picks its command by ARGOCD_BINARY_NAME (else argv[0]'s basename), as upstream's does. It
// leaves out the API server (and so the embedded UI, Dex and the CLI's client stack): an
// Application is created with kubectl, and its status is read from the Application object.
//
// git-ask-pass stays: the repo server runs git with GIT_ASKPASS=argocd and
// ARGOCD_BINARY_NAME=argocd-git-ask-pass (util/askpass), so this binary must be on the repo
// server's PATH under the name argocd and answer as the credential helper.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	// As upstream's main: klog (client-go) logs through logrus in Argo CD's format.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	name := filepath.Base(os.Args[0])
	if v := os.Getenv("ARGOCD_BINARY_NAME"); v != "" {
		name = v
	}
	var command *cobra.Command
	switch name {
	case "argocd-application-controller":
		command = appcontroller.NewCommand()
	case "argocd-repo-server":
		command = reposerver.NewCommand()
	case "argocd-git-ask-pass":
		command = gitaskpass.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "argocd: set ARGOCD_BINARY_NAME to argocd-application-controller, "+
			"argocd-repo-server or argocd-git-ask-pass (got %q)\n", name)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
