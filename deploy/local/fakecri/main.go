// Command fakecri is a container runtime for the local test cluster: the CRI fake from
// k8s.io/cri-client, plus a record of what the kubelet asked for. Every CreateContainer
// request is appended as one JSON line to --record, so tests can check the CDI device IDs
// that gpudra's claims delivered to the runtime.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

type createRecord struct {
	PodNamespace string   `json:"podNamespace"`
	PodName      string   `json:"podName"`
	PodUID       string   `json:"podUID"`
	Container    string   `json:"container"`
	CDIDevices   []string `json:"cdiDevices"`
}

type recordingRuntime struct {
	*fake.RemoteRuntime
	mu     sync.Mutex
	record *os.File
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	rec := createRecord{Container: req.GetConfig().GetMetadata().GetName(), CDIDevices: []string{}}
	if md := req.GetSandboxConfig().GetMetadata(); md != nil {
		rec.PodNamespace, rec.PodName, rec.PodUID = md.Namespace, md.Name, md.Uid
	}
	for _, d := range req.GetConfig().GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.Name)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	_, err = r.record.Write(append(line, '\n'))
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket to serve the CRI on, e.g. unix:///tmp/cri.sock")
	recordPath := flag.String("record", "", "file that receives one JSON line per CreateContainer")
	flag.Parse()
	if *endpoint == "" || *recordPath == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --endpoint and --record are required")
		os.Exit(2)
	}
	record, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
	base := fake.NewFakeRemoteRuntime()
	// The kubelet refuses images whose size is unset ("Id or size of image is not set").
	base.ImageService.SetFakeImageSize(4096)

	rt := &recordingRuntime{RemoteRuntime: base, record: record}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, rt)
	kubeapi.RegisterImageServiceServer(server, rt)
	base.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
}
