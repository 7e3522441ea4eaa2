// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3's
// etcdmain package. The upstream `etcd` main package lives in the root module
// go.etcd.io/etcd/v3, whose go.mod uses local replace directives and so cannot
// be required from another module; etcdmain.Main is the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
