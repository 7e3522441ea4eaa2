"""The Strata e2e harness: a real Kubernetes control plane and a node agent on one machine."""
