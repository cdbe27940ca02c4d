package main

// The node's allowance of non-default paths (DESIGN §4.1). The network config
// is not the node's to trust: with Multus a namespaced
// NetworkAttachmentDefinition writes it, and the shim runs as root. So a
// "daemon_socket" or "state_dir" other than the default is honoured only
// when a file beside the shim's executable lists it, and only when that file
// is root's own: owned by uid 0, a regular file (not a symlink), writable by
// nobody else. An attacker who controls stdin controls neither the
// executable's directory nor what root wrote there. (A shim run by another
// user, as tests run it, also trusts that user's own file: it then holds no
// more than that user's rights.)

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// allowFileName is looked up in the directory of the running executable.
const allowFileName = "kuryr-cni-paths.json"

const maxAllowFile = 64 << 10

// allowance is the allow file's content: for each key, the paths allowed
// besides the default. An entry ending in "/" allows every path below that
// directory (given without "." or ".." components).
type allowance struct {
	DaemonSocket []string `json:"daemon_socket"`
	StateDir     []string `json:"state_dir"`
}

// allowFilePath is the allow file beside the running executable, or "" when
// the executable cannot be found (a chroot without /proc): then only the
// defaults are honoured.
func allowFilePath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), allowFileName)
}

// nodeAllowance reads the allow file at path lazily, once.
type nodeAllowance struct {
	path   string
	loaded bool
	allow  allowance
	err    error // why nothing is allowed (no file, a file not root's own, ...)
}

// permits says whether the node allows path for key ("daemon_socket" or
// "state_dir"); when not, the error says why, for the CNI error's details.
func (n *nodeAllowance) permits(key, path string) error {
	if !n.loaded {
		n.allow, n.err = readAllowance(n.path)
		n.loaded = true
	}
	why := fmt.Sprintf("the shim honours a %s other than the default only when %s "+
		"(owned by root, writable by root alone) lists it", key, n.describe())
	if n.err != nil {
		return fmt.Errorf("%s; %v", why, n.err)
	}
	entries := n.allow.DaemonSocket
	if key == "state_dir" {
		entries = n.allow.StateDir
	}
	for _, entry := range entries {
		if entry == path || (strings.HasSuffix(entry, "/") && strings.HasPrefix(path, entry) &&
			filepath.Clean(path) == path) {
			return nil
		}
	}
	return errors.New(why + "; it does not")
}

func (n *nodeAllowance) describe() string {
	if n.path == "" {
		return allowFileName + " beside the shim"
	}
	return n.path
}

// readAllowance reads and checks the allow file; a missing file allows nothing.
func readAllowance(path string) (allowance, error) {
	var allow allowance
	if path == "" {
		return allow, errors.New("the shim's own path is unknown here")
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return allow, errors.New("there is no such file")
	}
	if err != nil {
		return allow, fmt.Errorf("it cannot be read: %v", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return allow, fmt.Errorf("it cannot be read: %v", err)
	}
	stat, ok := info.Sys().(*syscall.Stat_t)
	switch {
	case !info.Mode().IsRegular():
		return allow, errors.New("it is ignored: not a regular file")
	case !ok || (stat.Uid != 0 && int(stat.Uid) != os.Geteuid()):
		return allow, errors.New("it is ignored: not owned by root")
	case info.Mode().Perm()&0o022 != 0:
		return allow, errors.New("it is ignored: writable by group or others")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAllowFile+1))
	if err != nil {
		return allow, fmt.Errorf("it cannot be read: %v", err)
	}
	if len(data) > maxAllowFile {
		return allow, fmt.Errorf("it is ignored: larger than %d bytes", maxAllowFile)
	}
	if err := json.Unmarshal(data, &allow); err != nil {
		return allowance{}, fmt.Errorf("it is ignored: not a JSON object of path lists: %v", err)
	}
	return allow, nil
}
