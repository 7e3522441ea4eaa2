// Command kstatus prints the status that kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status,
// the library Argo CD and Flux compute health with) gives each object read from stdin: the
// JSON of one object or of a List (`kubectl get ... -o json | kstatus`). One line of JSON per
// object: {"kind", "name", "status", "message"}; exit status 1 when the input is not JSON of
// objects or kstatus cannot compute a status.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type line struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var obj unstructured.Unstructured
	if err := obj.UnmarshalJSON(data); err != nil {
		return fmt.Errorf("stdin is not the JSON of an object: %w", err)
	}
	objects := []unstructured.Unstructured{obj}
	if obj.IsList() {
		list, err := obj.ToList()
		if err != nil {
			return err
		}
		objects = list.Items
	}
	encoder := json.NewEncoder(out)
	for i := range objects {
		result, err := status.Compute(&objects[i])
		if err != nil {
			return fmt.Errorf("%s %s: %w", objects[i].GetKind(), objects[i].GetName(), err)
		}
		err = encoder.Encode(line{objects[i].GetKind(), objects[i].GetName(), result.Status.String(), result.Message})
		if err != nil {
			return err
		}
	}
	return nil
}
