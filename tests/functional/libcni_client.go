// A minimal runtime built on the real libcni, for tests/functional/test_libcni.py.
//
// Usage: libcni_client add|check|del CONFLIST BIN_DIR CACHE_DIR CONTAINER_ID NETNS IFNAME CNI_ARGS
//
// It runs libcni's AddNetworkList, CheckNetworkList or DelNetworkList, which
// find the plugin in BIN_DIR by its "type", export the CNI_* variables, inject
// prevResult and keep the result cache exactly as containerd and CRI-O do.
// Prints {"result": ...} (ADD) or {} on success, {"error": msg, "code": n}
// on failure (code 0 when the error is libcni's own, not the plugin's), and
// exits 0 either way: the test judges the JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if len(os.Args) != 9 {
		fmt.Fprintln(os.Stderr, "usage: libcni_client add|check|del CONFLIST BIN_DIR CACHE_DIR CONTAINER_ID NETNS IFNAME CNI_ARGS")
		os.Exit(2)
	}
	command, conflist, binDir, cacheDir := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	list, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rt := &libcni.RuntimeConf{ContainerID: os.Args[5], NetNS: os.Args[6], IfName: os.Args[7],
		Args: parseArgs(os.Args[8])}
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, nil)
	ctx := context.Background()
	out := map[string]interface{}{}
	switch command {
	case "add":
		var result types.Result
		if result, err = cni.AddNetworkList(ctx, list, rt); err == nil {
			out["result"] = result
		}
	case "check":
		err = cni.CheckNetworkList(ctx, list, rt)
	case "del":
		err = cni.DelNetworkList(ctx, list, rt)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", command)
		os.Exit(2)
	}
	if err != nil {
		out = map[string]interface{}{"error": err.Error(), "code": 0}
		var cniErr *types.Error
		if errors.As(err, &cniErr) {
			out["code"] = cniErr.Code
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
}

func parseArgs(text string) [][2]string {
	args := [][2]string{}
	for _, pair := range strings.Split(text, ";") {
		if kv := strings.SplitN(pair, "=", 2); len(kv) == 2 {
			args = append(args, [2]string{kv[0], kv[1]})
		}
	}
	return args
}
