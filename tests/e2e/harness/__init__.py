"""The Strata e2e harness: a Kubernetes control plane and three real kubelet nodes on one machine."""
