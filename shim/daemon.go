package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// daemonRefusal is the daemon's own CNI error answer, printed unchanged.
type daemonRefusal struct {
	answer []byte
}

func (r *daemonRefusal) Error() string {
	return string(r.answer)
}

var errTooLarge = fmt.Errorf("response larger than %d bytes", maxResponse)

// forward asks the daemon to run command and relays its answer, waiting
// for a daemon out of reach as long as command may (wait.go). A daemon still
// out of reach is code 11 (try again later), or 50 for STATUS (CNI spec).
func forward(command string, body []byte, s settings) ([]byte, error) {
	started := time.Now()
	deadline := started.Add(s.timeout)
	until := patience(command, started, deadline)
	attempts := 0
	for pause := firstPause; ; pause = nextPause(pause) {
		attempts++
		out, err := exchange(command, body, s.socket, deadline)
		if err == nil || !worthWaiting(command, err, pause, until) {
			return out, asCNIError(command, err, attempts, time.Since(started))
		}
		time.Sleep(pause)
	}
}

// exchange is one attempt: the request sent, the answer relayed.
func exchange(command string, body []byte, socket string, deadline time.Time) ([]byte, error) {
	status, answer, err := callDaemon(socket, routes[command], body, deadline)
	if err != nil {
		return nil, err
	}
	return relay(command, status, answer)
}

// asCNIError turns a failure to reach the daemon into the CNI error the
// runtime gets; the daemon's own answers, and errors already CNI errors,
// pass unchanged.
func asCNIError(command string, err error, attempts int, waited time.Duration) error {
	var cniErr *cniError
	var refusal *daemonRefusal
	if err == nil || errors.As(err, &cniErr) || errors.As(err, &refusal) {
		return err
	}
	details := err.Error()
	if attempts > 1 {
		details = fmt.Sprintf("%s (%d attempts in %.1f s)", details, attempts, waited.Seconds())
	}
	if command == "STATUS" {
		return &cniError{codePluginNotAvailable, "kuryr-cni daemon not available", details}
	}
	return &cniError{codeTryAgainLater, "kuryr-cni daemon unreachable, try again later", details}
}

// callDaemon POSTs body to path on the daemon's socket and returns the
// answer's status and body. deadline bounds the whole exchange. Errors: an
// *unanswered when the connection ended before any byte of an answer, a
// *cniError (code 11) for an answer that is not well-formed HTTP or is cut
// short, any other error when the daemon could not be reached or went silent
// (whether it saw the request is then unknown).
func callDaemon(socket, path string, body []byte, deadline time.Time) (int, []byte, error) {
	conn, err := (&net.Dialer{Deadline: deadline}).Dial("unix", socket)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: kuryr-cni\r\nUser-Agent: kuryr-cni-shim/%s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		path, version, len(body))
	if _, err := conn.Write(append([]byte(head), body...)); err != nil {
		if isHangUp(err) {
			return 0, nil, &unanswered{err}
		}
		return 0, nil, err
	}
	reader := &answerReader{conn: conn, left: maxResponse}
	status, answer, err := readResponse(bufio.NewReader(reader))
	if reader.read == 0 && isHangUp(reader.err) {
		return 0, nil, &unanswered{reader.err}
	}
	var netErr net.Error
	if errors.As(reader.err, &netErr) {
		return 0, nil, reader.err
	}
	if err != nil {
		return 0, nil, malformed(err.Error())
	}
	return status, answer, nil
}

// isHangUp says whether err is the peer closing the connection (not a timeout).
func isHangUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// readResponse reads one HTTP/1.1 response. The daemon frames every body
// with Content-Length; one framed by the end of the connection is read too,
// a Transfer-Encoding is refused.
func readResponse(r *bufio.Reader) (int, []byte, error) {
	reader := textproto.NewReader(r)
	line, err := reader.ReadLine()
	if err != nil {
		return 0, nil, cutShort(err)
	}
	status, err := parseStatusLine(line)
	if err != nil {
		return 0, nil, err
	}
	header, err := reader.ReadMIMEHeader()
	if err != nil {
		return 0, nil, cutShort(err)
	}
	if status == 204 || status == 304 {
		return status, nil, nil
	}
	if coding := header.Get("Transfer-Encoding"); coding != "" {
		return 0, nil, fmt.Errorf("unsupported Transfer-Encoding %q", coding)
	}
	lengths := header.Values("Content-Length")
	if len(lengths) == 0 {
		answer, err := io.ReadAll(r)
		return status, answer, err
	}
	length, err := strconv.ParseUint(lengths[0], 10, 31)
	if err != nil {
		return 0, nil, fmt.Errorf("bad Content-Length %q", lengths[0])
	}
	for _, other := range lengths[1:] {
		if other != lengths[0] {
			return 0, nil, errors.New("conflicting Content-Length headers")
		}
	}
	if length > maxResponse {
		return 0, nil, errTooLarge
	}
	answer := make([]byte, length)
	if _, err := io.ReadFull(r, answer); err != nil {
		return 0, nil, cutShort(err)
	}
	return status, answer, nil
}

// parseStatusLine reads "HTTP/1.x NNN reason". Interim (1xx) answers never
// come: the request asks for no Expect or Upgrade.
func parseStatusLine(line string) (int, error) {
	parts := strings.SplitN(line, " ", 3)
	if len(parts) >= 2 && strings.HasPrefix(parts[0], "HTTP/1.") && len(parts[1]) == 3 {
		if status, err := strconv.Atoi(parts[1]); err == nil && status >= 200 {
			return status, nil
		}
	}
	return 0, fmt.Errorf("bad status line %.200q", line)
}

func cutShort(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("connection closed before the response was complete")
	}
	return err
}

// relay turns the daemon's answer into our output: a 200 with a JSON object
// is the result, a 204 is a success without one (not for ADD, which must
// produce a result), a 4xx or 5xx with a CNI error object is the daemon's
// refusal. Anything else is malformed.
func relay(command string, status int, answer []byte) ([]byte, error) {
	switch {
	case status == 200 && isJSONObject(answer, false):
		return answer, nil
	case status == 204 && command != "ADD":
		return nil, nil
	case status >= 400 && status <= 599 && isJSONObject(answer, true):
		return nil, &daemonRefusal{answer}
	}
	return nil, malformed(fmt.Sprintf("HTTP %d to %s, body %.200q", status, command, answer))
}

// isJSONObject says whether data is one JSON object, with an integer "code"
// when withCode.
func isJSONObject(data []byte, withCode bool) bool {
	object, err := decodeObject(data)
	if err != nil {
		return false
	}
	if !withCode {
		return true
	}
	_, err = strconv.Atoi(string(object["code"]))
	return err == nil
}

func malformed(details string) error {
	return &cniError{codeTryAgainLater, "malformed response from the kuryr-cni daemon", details}
}

// answerReader reads the daemon's answer. Past its limit it fails rather
// than ends: a cut answer must not pass for a whole one. It keeps the
// connection's error, which bufio drops when it returns a partial line.
type answerReader struct {
	conn net.Conn
	left int
	read int // bytes read so far
	err  error
}

func (r *answerReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, errTooLarge
	}
	if len(p) > r.left {
		p = p[:r.left]
	}
	n, err := r.conn.Read(p)
	r.left -= n
	r.read += n
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}
