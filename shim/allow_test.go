package main

// The node's allowance of non-default paths (allow.go): a network config,
// which a NetworkAttachmentDefinition may write, steers the root shim only
// where a root-owned file beside the executable allows it.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testAllowFile allows every path under the system's temporary directory
// (where each test's world lives) and /nonexistent/, to the tests of
// main_test.go that call run(); owned by whoever runs the tests.
var testAllowFile string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kuryr-cni-allow")
	if err != nil {
		panic(err)
	}
	tmp := filepath.Clean(os.TempDir()) + "/"
	testAllowFile = writeAllowFile(dir, fmt.Sprintf(
		`{"daemon_socket": [%q, "/nonexistent/"], "state_dir": [%q, "/nonexistent/"]}`,
		tmp, tmp), 0o644)
	status := m.Run()
	os.RemoveAll(dir)
	os.Exit(status)
}

func writeAllowFile(dir, content string, mode os.FileMode) string {
	path := filepath.Join(dir, allowFileName)
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		panic(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		panic(err)
	}
	return path
}

// runAllowed runs the shim with the allow file at allowFile.
func runAllowed(env map[string]string, stdin, allowFile string) (int, string) {
	var out bytes.Buffer
	status := dispatch(func(key string) string { return env[key] }, strings.NewReader(stdin),
		&out, allowFile)
	return status, out.String()
}

// An allow file that lists only the world's daemon and state dir.
func exactAllowFile(t *testing.T, w *world) string {
	return writeAllowFile(t.TempDir(), fmt.Sprintf(`{"daemon_socket": [%q], "state_dir": [%q]}`,
		w.daemon.path, w.stateDir()), 0o644)
}

func TestPathsTheNodeAllowsAreHonoured(t *testing.T) {
	for _, v := range supportedVersions {
		w := newWorld(t)
		allow := exactAllowFile(t, w)
		if code, out := runAllowed(cniEnv("DEL"), w.config(v, nil), allow); code != 0 ||
			len(w.daemon.received()) != 1 {
			t.Fatalf("%s: %d %s, the daemon got %d", v, code, out, len(w.daemon.received()))
		}
		w.daemon.stop() // the next DEL is queued in the allowed state dir
		code, out := runAllowed(cniEnv("DEL"), w.config(v, nil), allow)
		queued, _ := os.ReadDir(filepath.Join(w.stateDir(), queueDir))
		if code != 0 || len(queued) != 1 {
			t.Fatalf("%s: %d %s, %d queued", v, code, out, len(queued))
		}
	}
}

// Every way the node may fail to allow a path: the ADD is refused (code 7)
// naming the key and why, and nothing is sent or written.
func TestPathsTheNodeDoesNotAllowRefuseTheAdd(t *testing.T) {
	cases := []struct {
		name, want string
		allow      func(t *testing.T, w *world) string
		extra      map[string]interface{}
	}{
		{"no allow file", "no such file",
			func(t *testing.T, w *world) string { return filepath.Join(t.TempDir(), "none") },
			nil},
		{"the shim's path unknown", "unknown",
			func(t *testing.T, w *world) string { return "" }, nil},
		{"a socket not listed", "does not",
			func(t *testing.T, w *world) string { return exactAllowFile(t, w) },
			map[string]interface{}{"daemon_socket": "/run/other/daemon.sock"}},
		{"a state dir not listed", "does not",
			func(t *testing.T, w *world) string { return exactAllowFile(t, w) },
			map[string]interface{}{"state_dir": "/var/lib/other"}},
		{"an escape from a listed directory", "does not",
			func(t *testing.T, w *world) string {
				return writeAllowFile(t.TempDir(), fmt.Sprintf(
					`{"daemon_socket": [%q, %q], "state_dir": [%q]}`, w.daemon.path,
					w.dir+"/a/", w.stateDir()), 0o644)
			},
			map[string]interface{}{"state_dir": "/x", "daemon_socket": "/y"}},
		{"dot-dot below a listed directory", "does not",
			func(t *testing.T, w *world) string {
				return writeAllowFile(t.TempDir(), fmt.Sprintf(
					`{"daemon_socket": [%q], "state_dir": [%q]}`, w.daemon.path, w.dir+"/a/"),
					0o644)
			},
			map[string]interface{}{"state_dir": "WORLD/a/../../etc"}},
		{"a group-writable allow file", "writable by group",
			func(t *testing.T, w *world) string {
				return writeAllowFile(t.TempDir(), fmt.Sprintf(
					`{"daemon_socket": [%q], "state_dir": [%q]}`, w.daemon.path, w.stateDir()),
					0o664)
			}, nil},
		{"a symlinked allow file", "cannot be read",
			func(t *testing.T, w *world) string {
				link := filepath.Join(t.TempDir(), allowFileName)
				if err := os.Symlink(exactAllowFile(t, w), link); err != nil {
					t.Fatal(err)
				}
				return link
			}, nil},
		{"an allow file that is not JSON", "not a JSON object",
			func(t *testing.T, w *world) string {
				return writeAllowFile(t.TempDir(), w.daemon.path, 0o644)
			}, nil},
	}
	for _, c := range cases {
		for _, v := range supportedVersions {
			w := newWorld(t)
			extra := map[string]interface{}{}
			for key, value := range c.extra {
				extra[key] = strings.Replace(value.(string), "WORLD", w.dir, 1)
			}
			code, out := runAllowed(cniEnv("ADD"), w.config(v, extra), c.allow(t, w))
			e := mustFail(t, code, out, 7, v)
			if !strings.Contains(e.Msg, "is not allowed on this node") ||
				!strings.Contains(e.Details, c.want) {
				t.Errorf("%s, %s: %+v", c.name, v, e)
			}
			if got := len(w.daemon.received()); got != 0 {
				t.Errorf("%s, %s: the daemon got %d requests", c.name, v, got)
			}
			if _, err := os.Stat(w.stateDir()); !os.IsNotExist(err) {
				t.Errorf("%s, %s: the state dir was made", c.name, v)
			}
		}
	}
}

// A DEL is never refused for its paths (it would be retried for ever, or
// lost): one the node does not allow goes to the default daemon and, that
// unreachable, into the default state dir's queue, which that daemon
// replays. The paths from stdin are neither dialled nor written.
func TestADelWithPathsTheNodeDoesNotAllowUsesTheDefaults(t *testing.T) {
	for _, v := range supportedVersions {
		for _, defaultUp := range []bool{true, false} {
			w, node := newWorld(t), newWorld(t)
			withDefaults(t, node.daemon.path, node.stateDir())
			if !defaultUp {
				node.daemon.stop()
			}
			none := filepath.Join(t.TempDir(), "none")

			code, out := runAllowed(cniEnv("DEL"), w.config(v, nil), none)

			if code != 0 || out != "" {
				t.Fatalf("%s: %d %s", v, code, out)
			}
			if got := len(w.daemon.received()); got != 0 {
				t.Errorf("%s: the stdin's daemon got %d requests", v, got)
			}
			if _, err := os.Stat(w.stateDir()); !os.IsNotExist(err) {
				t.Errorf("%s: the stdin's state dir was written", v)
			}
			queued, _ := os.ReadDir(filepath.Join(node.stateDir(), queueDir))
			if defaultUp && (len(node.daemon.received()) != 1 || len(queued) != 0) {
				t.Errorf("%s: the default daemon got %d DELs, %d queued", v,
					len(node.daemon.received()), len(queued))
			}
			if !defaultUp && len(queued) != 1 {
				t.Errorf("%s: %d DELs queued in the default state dir, not 1", v, len(queued))
			}
		}
	}
}

// withDefaults makes the default paths the test's until it ends.
func withDefaults(t *testing.T, socket, stateDir string) {
	oldSocket, oldStateDir := defaultSocket, defaultStateDir
	defaultSocket, defaultStateDir = socket, stateDir
	t.Cleanup(func() { defaultSocket, defaultStateDir = oldSocket, oldStateDir })
}

func TestATimeoutAboveTheBoundRefusesTheAddButNotTheDel(t *testing.T) {
	for _, v := range supportedVersions {
		w := newWorld(t)
		conf := w.config(v, map[string]interface{}{"timeout": maxTimeout + 1})
		code, out := run(cniEnv("ADD"), conf)
		if e := mustFail(t, code, out, 7, v); !strings.Contains(e.Msg, "timeout") {
			t.Errorf("%s: %+v", v, e)
		}
		if code, out := run(cniEnv("DEL"), conf); code != 0 {
			t.Errorf("%s: DEL %d %s", v, code, out)
		}
		if got := len(w.daemon.received()); got != 1 {
			t.Errorf("%s: the daemon got %d requests, not the DEL alone", v, got)
		}
	}
}
