// Command pause is the sandbox container of the e2e node's pods: it holds the pod's namespaces until it is told
// to stop, and reaps the zombies of a pod that shares its process namespace. It is built here because no image
// registry is reachable to pull registry.k8s.io/pause; hack/e2ecluster.py makes it an image FROM scratch.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
