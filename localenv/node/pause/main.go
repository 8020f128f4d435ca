// The node tier's pause image (localenv/node/images.py): the process that holds a pod's
// namespaces. It waits for a signal, reaps orphaned children (it is PID 1 of a shared PID
// namespace) and exits 0 on SIGINT or SIGTERM. Built static, it is the image's only file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
