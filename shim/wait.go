package main

import (
	"encoding/json"
	"errors"
	"syscall"
	"time"
)

// A daemon out of reach is, nearly always, a daemon restarting: a DaemonSet
// update, `systemctl restart`, a crash and its supervisor's restart take a
// few seconds. Failing the request at once would cost the runtime a
// FailedCreatePodSandBox and its back-off for each pod started meanwhile, so
// the shim waits for the next daemon instead, bounded:
//
//   - ADD and CHECK wait until the request's own timeout: the runtime gave
//     them that long, and both may be sent again (a retried ADD of a sandbox
//     is one the runtime may send anyway), so one the daemon did not answer
//     is safe to send again. A node with no daemon installed at all fails
//     them at the timeout, as an ADD the daemon cannot finish would.
//   - STATUS waits at most statusPatience, less than the 5 s between two of
//     kubelet's runtime status polls, for a daemon that is out of reach or
//     answers "not available" (a new daemon still syncing, an old one
//     shutting down): a planned restart shorter than that is never reported.
//   - DEL does not wait: it is queued (queue.go) and the daemon replays it.
//     GC does not either: the runtime sends it again later.

// statusPatience bounds STATUS's wait for a daemon that is not available.
const statusPatience = 4 * time.Second

// The pauses between attempts: short at first (a replacement daemon is often
// seconds away, and an ADD's wait adds to the pod's start), doubling up to
// maxPause (a few dozen waiting shims cost the node a few hundred connect()
// calls a second at most).
const (
	firstPause = 20 * time.Millisecond
	maxPause   = 200 * time.Millisecond
)

// unanswered is a connection the daemon ended without sending a byte: it
// stopped listening, or died or stopped with the request unread or unanswered.
type unanswered struct {
	err error
}

func (e *unanswered) Error() string {
	return "connection closed with no answer: " + e.err.Error()
}

func (e *unanswered) Unwrap() error {
	return e.err
}

// patience is until when command waits for a daemon that is not available;
// deadline is the request's own.
func patience(command string, started, deadline time.Time) time.Time {
	switch command {
	case "ADD", "CHECK":
		return deadline
	case "STATUS":
		if limit := started.Add(statusPatience); limit.Before(deadline) {
			return limit
		}
		return deadline
	}
	return started
}

// outOfReach says whether err shows that no daemon took the request: the
// socket is absent, nobody listens on it, its backlog is full, or the
// connection ended before any answer. Not a timeout: a daemon that is slow
// may be working on the request. Not a refused connect (EACCES): waiting
// cannot cure that.
func outOfReach(err error) bool {
	var closed *unanswered
	return errors.As(err, &closed) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN)
}

// notAvailable says whether the daemon answered "not available" (code 50).
func notAvailable(err error) bool {
	var refusal *daemonRefusal
	if !errors.As(err, &refusal) {
		return false
	}
	var answer struct {
		Code int `json:"code"`
	}
	return json.Unmarshal(refusal.answer, &answer) == nil &&
		answer.Code == codePluginNotAvailable
}

// worthWaiting says whether command, which got err, may try again after
// pause without passing until.
func worthWaiting(command string, err error, pause time.Duration, until time.Time) bool {
	if !time.Now().Add(pause).Before(until) {
		return false
	}
	return outOfReach(err) || (command == "STATUS" && notAvailable(err))
}

func nextPause(pause time.Duration) time.Duration {
	if pause*2 > maxPause {
		return maxPause
	}
	return pause * 2
}
