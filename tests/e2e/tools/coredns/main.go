// Command coredns is the e2e cluster's DNS server: CoreDNS with only the plugins the
// harness's Corefile uses (tests/e2e/harness/addons.py), in the order CoreDNS itself runs
// them. The full build links every plugin CoreDNS ships, cloud SDKs included, and took
// five times as long to compile here for a server that answers cluster names only.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// Directives name the plugins a Corefile may use; a server block runs them in this
	// order, whatever order the Corefile writes them in (CoreDNS's own plugin.cfg order).
	dnsserver.Directives = []string{"ready", "health", "errors", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
