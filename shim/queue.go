package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// queueDir holds the DELs the daemon replays (kuryr_cni.state.DelQueue).
const queueDir = "del-queue"

// queueIfUnanswered queues a DEL the daemon did not answer: DEL is
// idempotent, so one the daemon may already have run is safe to replay, and
// the runtime is told it succeeded. Only the daemon's own refusal, or a
// queue that cannot be written, is a failure.
func queueIfUnanswered(forwardErr error, body []byte, stateDir string) error {
	var refusal *daemonRefusal
	if forwardErr == nil || errors.As(forwardErr, &refusal) {
		return forwardErr
	}
	if err := queueDel(stateDir, body); err != nil {
		return &cniError{codeTryAgainLater,
			"the kuryr-cni daemon did not answer and the DEL could not be queued",
			fmt.Sprintf("daemon: %v; queue: %v", forwardErr, err)}
	}
	return nil
}

// queueDel writes body to <stateDir>/del-queue/<time_ns>-<pid>.json, whole
// or not at all, and durably. The temporary name starts with '.' and ends
// with '.tmp': the daemon reads only *.json names, and removes what a shim
// killed mid-write left.
func queueDel(stateDir string, body []byte) error {
	dir := filepath.Join(stateDir, queueDir)
	if err := ensureDir(dir); err != nil {
		return err
	}
	name := fmt.Sprintf("%d-%d", time.Now().UnixNano(), os.Getpid())
	return writeAtomically(filepath.Join(dir, name+".json"), filepath.Join(dir, "."+name+".tmp"),
		body)
}

// writeAtomically creates path holding data (mode 0600) so that readers see
// it whole or not at all, and it survives a crash once this returns: written
// to tmp (a new file in the same directory), fsynced, renamed, and the
// directory fsynced. The temporary file is removed on failure.
func writeAtomically(path, tmp string, data []byte) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = writeSynced(f, data)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return fsyncDir(filepath.Dir(path))
}

func writeSynced(f *os.File, data []byte) error {
	err := f.Chmod(0o600) // whatever the umask
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// ensureDir creates dir (0700) and its missing parents, each made durable in
// its parent directory.
func ensureDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil:
		return fsyncDir(filepath.Dir(dir))
	case errors.Is(err, fs.ErrExist):
		return nil
	case errors.Is(err, fs.ErrNotExist): // no state dir yet: the daemon never ran here
		if err := ensureDir(filepath.Dir(dir)); err != nil {
			return err
		}
		return ensureDir(dir) // (another shim may be making it right now)
	}
	return err
}

func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if closeErr := d.Close(); err == nil {
		err = closeErr
	}
	return err
}
