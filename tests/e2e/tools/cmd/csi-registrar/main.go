// Command csi-registrar registers a CSI node plugin with kubelet, in place of
// the node-driver-registrar sidecar (not available from the Go module proxy).
// It asks the plugin its driver name (CSI GetPluginInfo on --csi-address), then
// serves kubelet's plugin registration API on
// <--plugin-registration-path>/<driver>-reg.sock, answering that the plugin is
// a CSI plugin reached at --kubelet-registration-path. Takes the sidecar's flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registration.UnimplementedRegistrationServer
	driver, endpoint string
}

func (s *server) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	log.Printf("kubelet asked for the plugin info of %s", s.driver)
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              s.driver,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		// The sidecar exits too: kubelet retries when the socket comes back.
		log.Fatalf("kubelet did not register %s: %s", s.driver, st.Error)
	}
	log.Printf("kubelet registered %s at %s", s.driver, s.endpoint)
	return &registration.RegistrationStatusResponse{}, nil
}

// driverName asks the plugin at address (unix:///path or /path) for its name,
// retrying until the plugin serves or the deadline passes.
func driverName(address string, timeout time.Duration) (string, error) {
	target := address
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("csi address %q: %w", address, err)
	}
	defer conn.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName(), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no plugin info from %s within %s: %v", address, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

func main() {
	csiAddress := flag.String("csi-address", "/csi/csi.sock", "the plugin's CSI socket, as this container sees it")
	kubeletPath := flag.String("kubelet-registration-path", "", "the plugin's CSI socket, as kubelet sees it")
	registrationDir := flag.String("plugin-registration-path", "/registration", "kubelet's plugins_registry folder")
	timeout := flag.Duration("timeout", 5*time.Minute, "how long to wait for the plugin to serve")
	flag.Parse()
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	name, err := driverName(*csiAddress, *timeout)
	if err != nil {
		log.Fatal(err)
	}
	socket := filepath.Join(*registrationDir, name+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing the old socket %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listening on %s: %v", socket, err)
	}
	grpcServer := grpc.NewServer()
	registration.RegisterRegistrationServer(grpcServer, &server{driver: name, endpoint: *kubeletPath})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		grpcServer.Stop()
		_ = os.Remove(socket)
		os.Exit(0)
	}()
	log.Printf("serving the registration of %s (endpoint %s) on %s", name, *kubeletPath, socket)
	if err := grpcServer.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
