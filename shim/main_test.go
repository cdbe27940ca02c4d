package main

// The shim's side of the shim <-> daemon protocol, through dispatch. The
// daemon is a fake on purpose: a unix-socket peer started in each test that
// records what the shim sent (parsed by net/http, which so checks our
// hand-written HTTP/1.1) and answers canned bytes, including the broken
// answers a real daemon should never give. The real daemon is behind the
// shim in the functional tests.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var forwarded = []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}

const addResult = `{"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": ` +
	`"/var/run/netns/x"}], "ips": [{"address": "10.10.0.5/24", "interface": 0}]}`

// --- the fake daemon ---------------------------------------------------------------

type request struct {
	method, path, proto, host string
	header                    http.Header
	body                      []byte
}

type fakeDaemon struct {
	path     string
	listener net.Listener
	release  chan struct{} // closed when the test ends: hanging replies return
	handlers sync.WaitGroup
	mu       sync.Mutex
	requests []request
	reply    func(conn net.Conn, release <-chan struct{})
}

// startDaemon serves a socket in dir until the test ends, answering 204.
func startDaemon(t *testing.T, dir string) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{path: filepath.Join(dir, "d.sock"), release: make(chan struct{})}
	d.answer(response(204, ""))
	listener, err := net.Listen("unix", d.path)
	if err != nil {
		t.Fatal(err)
	}
	d.listener = listener
	d.handlers.Add(1)
	go d.serve()
	t.Cleanup(d.stop)
	return d
}

func (d *fakeDaemon) serve() {
	defer d.handlers.Done()
	for {
		conn, err := d.listener.Accept()
		if err != nil {
			return
		}
		d.handlers.Add(1)
		go d.handle(conn)
	}
}

func (d *fakeDaemon) handle(conn net.Conn) {
	defer d.handlers.Done()
	defer conn.Close()
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	d.mu.Lock()
	d.requests = append(d.requests, request{req.Method, req.URL.Path, req.Proto, req.Host, req.Header, body})
	reply := d.reply
	d.mu.Unlock()
	reply(conn, d.release)
}

// answer makes the daemon answer raw bytes.
func (d *fakeDaemon) answer(raw string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reply = func(conn net.Conn, _ <-chan struct{}) { _, _ = conn.Write([]byte(raw)) }
}

func (d *fakeDaemon) behave(reply func(conn net.Conn, release <-chan struct{})) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reply = reply
}

func (d *fakeDaemon) received() []request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]request(nil), d.requests...)
}

// stop stops serving; the socket file stays, as a crashed daemon's would.
func (d *fakeDaemon) stop() {
	select {
	case <-d.release:
		return
	default:
	}
	close(d.release)
	d.listener.(*net.UnixListener).SetUnlinkOnClose(false)
	d.listener.Close()
	d.handlers.Wait()
}

func response(status int, body string) string {
	return fmt.Sprintf("HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
}

func hang(conn net.Conn, release <-chan struct{}) {
	<-release
}

func hangUp(conn net.Conn, release <-chan struct{}) {}

func cniErrorJSON(code int) string {
	return fmt.Sprintf(`{"cniVersion": "0.4.0", "code": %d, "msg": "boom",`+"\n"+
		` "details": "from the daemon"}`, code)
}

// --- running the shim -----------------------------------------------------------------

type world struct {
	dir    string
	daemon *fakeDaemon
}

func newWorld(t *testing.T) *world {
	dir := t.TempDir()
	return &world{dir: dir, daemon: startDaemon(t, dir)}
}

func (w *world) stateDir() string {
	return filepath.Join(w.dir, "state")
}

// config is a network config for this world's daemon; extra keys replace
// or add to it, a nil value removes the key.
func (w *world) config(cniVersion string, extra map[string]interface{}) string {
	conf := map[string]interface{}{"cniVersion": cniVersion, "name": "kuryr",
		"type": "kuryr-cni", "daemon_socket": w.daemon.path, "state_dir": w.stateDir(),
		"timeout": 5}
	for key, value := range extra {
		if value == nil {
			delete(conf, key)
		} else {
			conf[key] = value
		}
	}
	out, err := json.Marshal(conf)
	if err != nil {
		panic(err)
	}
	return string(out)
}

func cniEnv(command string, overrides ...string) map[string]string {
	env := map[string]string{"CNI_COMMAND": command, "CNI_CONTAINERID": "c0ffee",
		"CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
		"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod"}
	for i := 0; i < len(overrides); i += 2 {
		env[overrides[i]] = overrides[i+1]
	}
	return env
}

func run(env map[string]string, stdin string) (int, string) {
	return runReader(env, strings.NewReader(stdin))
}

func runReader(env map[string]string, stdin io.Reader) (int, string) {
	var out bytes.Buffer
	getenv := func(key string) string { return env[key] }
	status := dispatch(getenv, stdin, &out, testAllowFile)
	return status, out.String()
}

type errorOut struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details"`
}

func mustFail(t *testing.T, status int, out string, code int, cniVersion string) errorOut {
	t.Helper()
	var e errorOut
	decoder := json.NewDecoder(strings.NewReader(out))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&e); err != nil || status != 1 || !strings.HasSuffix(out, "}\n") {
		t.Fatalf("want a CNI error and status 1, got %d %q (%v)", status, out, err)
	}
	if e.Code != code || e.CNIVersion != cniVersion || e.Msg == "" {
		t.Fatalf("want code %d in %s, got %+v", code, cniVersion, e)
	}
	return e
}

func expectedBody(command string, env map[string]string, config string) string {
	var b strings.Builder
	b.WriteString("{")
	for _, key := range envKeys {
		value, _ := json.Marshal(env[key])
		if key == "CNI_COMMAND" {
			value, _ = json.Marshal(command)
		}
		fmt.Fprintf(&b, "%q:%s,", key, value)
	}
	return b.String() + `"config":` + strings.Trim(config, jsonSpace) + "}"
}

// --- VERSION ---------------------------------------------------------------------------

func TestVersionAnswersEachSpecVersionWithoutTheDaemon(t *testing.T) {
	for _, v := range supportedVersions {
		status, out := run(map[string]string{"CNI_COMMAND": "VERSION"},
			`{"cniVersion": "`+v+`", "daemon_socket": "/nonexistent/d.sock"}`)
		want := `{"cniVersion":"` + v + `","supportedVersions":["0.3.0","0.3.1","0.4.0",` +
			`"1.0.0","1.1.0"]}` + "\n"
		if status != 0 || out != want {
			t.Errorf("%s: got %d %q", v, status, out)
		}
	}
}

func TestVersionFallsBackToNewestOnAnyStdin(t *testing.T) {
	for _, stdin := range []string{"", `{"cniVersion": "0.2.0"}`, `{"cniVersion": 1}`, "{}",
		"not json", "[]", strings.Repeat("x", maxStdin+1)} {
		status, out := run(map[string]string{"CNI_COMMAND": "VERSION"}, stdin)
		if status != 0 || !strings.HasPrefix(out, `{"cniVersion":"1.1.0",`) {
			t.Errorf("%.20q: got %d %q", stdin, status, out)
		}
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) {
	return 0, errors.New("bad file descriptor")
}

func TestUnreadableStdinIsCode5ButVersionAnswers(t *testing.T) {
	status, out := runReader(map[string]string{"CNI_COMMAND": "VERSION"}, failingReader{})
	if status != 0 || !strings.HasPrefix(out, `{"cniVersion":"1.1.0"`) {
		t.Errorf("VERSION: got %d %q", status, out)
	}
	status, out = runReader(cniEnv("ADD"), failingReader{})
	mustFail(t, status, out, 5, "1.1.0")
}

// --- forwarding ----------------------------------------------------------------------------

func TestForwardsEveryCommandInEverySpecVersion(t *testing.T) {
	for _, command := range forwarded {
		for _, v := range supportedVersions {
			t.Run(command+"/"+v, func(t *testing.T) {
				w := newWorld(t)
				want := ""
				if command == "ADD" {
					w.daemon.answer(response(200, addResult))
					want = addResult
				}
				env := cniEnv(command)
				conf := w.config(v, map[string]interface{}{"prevResult": map[string]interface{}{
					"cniVersion": v, "ips": []string{}}})
				if status, out := run(env, conf); status != 0 || out != want {
					t.Fatalf("got %d %q", status, out)
				}
				requests := w.daemon.received()
				if len(requests) != 1 {
					t.Fatalf("%d requests", len(requests))
				}
				r := requests[0]
				if r.method != "POST" || r.proto != "HTTP/1.1" || r.path != routes[command] ||
					r.host != "kuryr-cni" {
					t.Errorf("request %s %s %s, Host %s", r.method, r.path, r.proto, r.host)
				}
				for name, value := range map[string]string{
					"Content-Type": "application/json", "Connection": "close",
					"User-Agent": "kuryr-cni-shim/" + version} {
					if got := r.header.Values(name); len(got) != 1 || got[0] != value {
						t.Errorf("%s: %q", name, got)
					}
				}
				if string(r.body) != expectedBody(command, env, conf) {
					t.Errorf("body %s", r.body)
				}
				assertQueue(t, w, 0)
			})
		}
	}
}

func TestConfigIsForwardedAsWritten(t *testing.T) {
	// Key order, layout, escapes and numbers no float holds arrive untouched.
	w := newWorld(t)
	config := "{\"type\": \"kuryr-cni\", \"cniVersion\": \"1.0.0\", \"z\": 1e400,\n" +
		` "n": 123456789012345678901234567890, "u": "é\u00e9", "h": "<&>",` +
		` "daemon_socket": "` + w.daemon.path + `"}`
	if status, out := run(cniEnv("CHECK"), "\n  "+config+"\n"); status != 0 || out != "" {
		t.Fatalf("got %d %q", status, out)
	}
	body := string(w.daemon.received()[0].body)
	if !strings.HasSuffix(body, `,"config":`+config+"}") {
		t.Errorf("body %s", body)
	}
}

func TestEmptyAndAbsentVariablesAreForwardedEmpty(t *testing.T) {
	// Runtimes export every variable, empty ones too; the second DEL has no netns.
	w := newWorld(t)
	env := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c0ffee", "CNI_NETNS": ""}
	conf := w.config("1.0.0", nil)
	if status, out := run(env, conf); status != 0 || out != "" {
		t.Fatalf("got %d %q", status, out)
	}
	want := `{"CNI_COMMAND":"DEL","CNI_CONTAINERID":"c0ffee","CNI_NETNS":"","CNI_IFNAME":"",` +
		`"CNI_ARGS":"","CNI_PATH":"","config":` + conf + "}"
	if body := string(w.daemon.received()[0].body); body != want {
		t.Errorf("body %s", body)
	}
}

func TestDaemonRefusalIsPrintedUnchanged(t *testing.T) {
	for _, command := range forwarded {
		for _, status := range []int{400, 404, 409, 413, 500, 503} {
			w := newWorld(t)
			w.daemon.answer(response(status, cniErrorJSON(7)))
			got, out := run(cniEnv(command), w.config("1.0.0", nil))
			if got != 1 || out != cniErrorJSON(7) {
				t.Errorf("%s %d: got %d %q", command, status, got, out)
			}
			assertQueue(t, w, 0)
		}
	}
}

func TestResultsAndFramings(t *testing.T) {
	cases := []struct{ name, command, reply, out string }{
		{"ADD result", "ADD", response(200, addResult), addResult},
		{"200 to DEL", "DEL", response(200, "{}"), "{}"},
		{"200 to CHECK", "CHECK", response(200, "{}"), "{}"},
		{"200 to STATUS", "STATUS", response(200, "{}"), "{}"},
		{"204 to GC", "GC", "HTTP/1.1 204 No Content\r\n\r\n", ""},
		{"until close", "ADD", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" +
			addResult, addResult},
		{"HTTP/1.0, lower case", "ADD", fmt.Sprintf(
			"HTTP/1.0 200 OK\r\ncontent-length: %d\r\n\r\n%s", len(addResult), addResult),
			addResult},
		{"same length twice", "ADD", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" +
			"Content-Length: 2\r\n\r\n{}", "{}"},
	}
	for _, c := range cases {
		w := newWorld(t)
		w.daemon.answer(c.reply)
		if status, out := run(cniEnv(c.command), w.config("1.0.0", nil)); status != 0 ||
			out != c.out {
			t.Errorf("%s: got %d %q", c.name, status, out)
		}
	}
}

// malformedAnswers are answers no daemon should give, cut or broken ones
// included: ADD is told to try again, DEL is queued.
var malformedAnswers = map[string]string{
	"garbage":                   "garbage\r\n\r\n",
	"cut in the status line":    "HTTP/1.1 20",
	"cut in the headers":        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
	"cut in the body":           response(200, addResult)[:60],
	"status not a number":       "HTTP/1.1 OK 200\r\nContent-Length: 0\r\n\r\n",
	"status below 200":          "HTTP/1.1 099 X\r\nContent-Length: 0\r\n\r\n",
	"interim answer":            "HTTP/1.1 100 Continue\r\n\r\n",
	"200 not JSON":              response(200, "not json"),
	"200 not an object":         response(200, "[1, 2]"),
	"200 not UTF-8":             response(200, "{\"a\": \"\xff\"}"),
	"204 to ADD":                "HTTP/1.1 204 No Content\r\n\r\n",
	"500 not JSON":              response(500, "Internal Server Error"),
	"503 without a code":        response(503, `{"msg": "no code"}`),
	"400 code a string":         response(400, `{"code": "7"}`),
	"400 code a bool":           response(400, `{"code": true}`),
	"400 code a float":          response(400, `{"code": 7.0}`),
	"redirect":                  "HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 11\r\n\r\n{\"code\": 7}",
	"201":                       response(201, addResult),
	"longer Content-Length":     fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(addResult)+10, addResult),
	"negative Content-Length":   "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}",
	"hex Content-Length":        "HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\n{}",
	"conflicting lengths":       "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ",
	"chunked":                   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
	"folded header":             "HTTP/1.1 200 OK\r\n Folded: header\r\nContent-Length: 2\r\n\r\n{}",
	"header without a colon":    "HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 2\r\n\r\n{}",
	"body over the limit":       response(200, `{"a": "`+strings.Repeat("x", maxResponse)+`"}`),
	"headers over the limit":    "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("x", maxResponse),
	"body until close too long": "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat(" ", maxResponse),
}

func TestMalformedAnswerToAddIsTryAgainLater(t *testing.T) {
	for name, reply := range malformedAnswers {
		w := newWorld(t)
		w.daemon.answer(reply)
		status, out := run(cniEnv("ADD"), w.config("0.4.0", nil))
		if e := mustFail(t, status, out, 11, "0.4.0"); !strings.Contains(e.Msg, "malformed") {
			t.Errorf("%s: %+v", name, e)
		}
		assertQueue(t, w, 0)
	}
}

func TestMalformedAnswerToStatusIsTryAgainLater(t *testing.T) {
	w := newWorld(t)
	w.daemon.answer(malformedAnswers["cut in the body"])
	status, out := run(cniEnv("STATUS"), w.config("1.1.0", nil))
	mustFail(t, status, out, 11, "1.1.0")
}

func TestTooLargeAnswerIsNamed(t *testing.T) {
	w := newWorld(t)
	w.daemon.answer(malformedAnswers["body over the limit"])
	status, out := run(cniEnv("ADD"), w.config("1.0.0", nil))
	if e := mustFail(t, status, out, 11, "1.0.0"); !strings.Contains(e.Details, "larger than") {
		t.Errorf("%+v", e)
	}
}

func TestDelWithoutATrustworthyAnswerIsQueued(t *testing.T) {
	for name, reply := range malformedAnswers {
		if name == "204 to ADD" {
			continue // a success, for DEL
		}
		w := newWorld(t)
		w.daemon.answer(reply)
		if status, out := run(cniEnv("DEL"), w.config("1.0.0", nil)); status != 0 || out != "" {
			t.Errorf("%s: got %d %q", name, status, out)
		}
		if entries := assertQueue(t, w, 1); string(entries[0]) != string(w.daemon.received()[0].body) {
			t.Errorf("%s: queued %s", name, entries[0])
		}
	}
}

// --- the daemon out of reach ------------------------------------------------------------

// unreachable gives a daemon socket nobody answers on: "absent" (no file),
// "stale" (a socket file nobody listens on) and "hung up" (the daemon reads
// the request and closes without a word).
func unreachable(t *testing.T, w *world, how string) (socket, reason string) {
	switch how {
	case "absent":
		return filepath.Join(w.dir, "absent", "d.sock"), "no such file"
	case "stale":
		w.daemon.stop()
		return w.daemon.path, "connection refused"
	}
	w.daemon.behave(hangUp)
	return w.daemon.path, "closed with no answer"
}

func TestUnreachableDaemon(t *testing.T) {
	for _, how := range []string{"absent", "stale", "hung up"} {
		for command, code := range map[string]int{"ADD": 11, "CHECK": 11, "GC": 11, "STATUS": 50} {
			w := newWorld(t)
			socket, reason := unreachable(t, w, how)
			conf := w.config("0.4.0", map[string]interface{}{"daemon_socket": socket,
				"timeout": 0.3})
			started := time.Now()
			status, out := run(cniEnv(command), conf)
			e := mustFail(t, status, out, code, "0.4.0")
			if how != "hung up" && !strings.Contains(e.Details, socket) ||
				!strings.Contains(e.Details, reason) {
				t.Errorf("%s %s: %+v", how, command, e)
			}
			// All but GC waited for a daemon, trying again, within the timeout.
			if waited := strings.Contains(e.Details, "attempts"); waited != (command != "GC") {
				t.Errorf("%s %s: %+v", how, command, e)
			}
			if elapsed := time.Since(started); elapsed > time.Second {
				t.Errorf("%s %s: took %v", how, command, elapsed)
			}
			assertQueue(t, w, 0)
		}
	}
}

// replaceDaemon starts a new fake daemon on socket after delay, removing a
// stale socket file first as the real daemon does; it answers reply.
func replaceDaemon(t *testing.T, socket string, delay time.Duration, reply string) chan *fakeDaemon {
	t.Helper()
	started := make(chan *fakeDaemon, 1)
	timer := time.AfterFunc(delay, func() {
		_ = os.MkdirAll(filepath.Dir(socket), 0o700)
		_ = os.Remove(socket)
		d := startDaemon(t, filepath.Dir(socket))
		d.answer(reply)
		started <- d
	})
	t.Cleanup(func() { timer.Stop() })
	return started
}

func TestAddCheckAndStatusWaitForTheNextDaemon(t *testing.T) {
	for _, how := range []string{"absent", "stale", "hung up"} {
		for command, reply := range map[string]string{"ADD": response(200, addResult),
			"CHECK": response(204, ""), "STATUS": response(204, "")} {
			w := newWorld(t)
			socket, _ := unreachable(t, w, how)
			next := replaceDaemon(t, socket, 300*time.Millisecond, reply)
			conf := w.config("1.1.0", map[string]interface{}{"daemon_socket": socket})
			status, out := run(cniEnv(command), conf)
			want := ""
			if command == "ADD" {
				want = addResult
			}
			if status != 0 || out != want {
				t.Fatalf("%s %s: got %d %q", how, command, status, out)
			}
			if got := len((<-next).received()); got != 1 {
				t.Errorf("%s %s: the next daemon got %d requests", how, command, got)
			}
		}
	}
}

func TestDelAndGCDoNotWait(t *testing.T) {
	for _, command := range []string{"DEL", "GC"} {
		w := newWorld(t)
		w.daemon.stop()
		next := replaceDaemon(t, w.daemon.path, 300*time.Millisecond, response(204, ""))
		status, _ := run(cniEnv(command), w.config("1.1.0", nil))
		if want := map[string]int{"DEL": 0, "GC": 1}[command]; status != want {
			t.Errorf("%s: got %d", command, status)
		}
		assertQueue(t, w, map[string]int{"DEL": 1, "GC": 0}[command])
		if got := len((<-next).received()); got != 0 {
			t.Errorf("%s: sent %d times to the next daemon", command, got)
		}
	}
}

func TestStatusWaitsBrieflyForADaemonNotAvailable(t *testing.T) {
	// A daemon shutting down, or starting and not yet synced, says "not available":
	// STATUS asks again, for a while, and reports what the last answer said.
	notAvailableYet := func(times int) func(net.Conn, <-chan struct{}) {
		var mu sync.Mutex
		return func(conn net.Conn, _ <-chan struct{}) {
			mu.Lock()
			defer mu.Unlock()
			reply := response(204, "")
			if times > 0 {
				times--
				reply = response(503, cniErrorJSON(50))
			}
			_, _ = conn.Write([]byte(reply))
		}
	}
	w := newWorld(t)
	w.daemon.behave(notAvailableYet(3))
	if status, out := run(cniEnv("STATUS"), w.config("1.1.0", nil)); status != 0 || out != "" {
		t.Fatalf("got %d %q", status, out)
	}
	if got := len(w.daemon.received()); got != 4 {
		t.Errorf("%d requests", got)
	}

	w = newWorld(t)
	w.daemon.behave(notAvailableYet(1 << 30))
	started := time.Now()
	status, out := run(cniEnv("STATUS"), w.config("1.1.0", nil))
	if elapsed := time.Since(started); status != 1 || out != cniErrorJSON(50) ||
		elapsed < statusPatience-maxPause || elapsed > statusPatience+time.Second {
		t.Errorf("got %d %q after %v", status, out, elapsed)
	}
	// Other refusals, and other commands' "not available", are final.
	for command, code := range map[string]int{"STATUS": 11, "ADD": 50} {
		w = newWorld(t)
		w.daemon.answer(response(503, cniErrorJSON(code)))
		if status, out := run(cniEnv(command), w.config("1.1.0", nil)); status != 1 ||
			out != cniErrorJSON(code) || len(w.daemon.received()) != 1 {
			t.Errorf("%s %d: got %d %q, %d requests", command, code, status, out,
				len(w.daemon.received()))
		}
	}
}

func TestUnreachableDelIsQueuedAndSucceeds(t *testing.T) {
	for _, how := range []string{"absent", "stale", "hung up"} {
		w := newWorld(t)
		socket, _ := unreachable(t, w, how)
		env := cniEnv("DEL", "CNI_NETNS", "")
		conf := w.config("0.3.1", map[string]interface{}{"daemon_socket": socket})
		if code, out := run(env, conf); code != 0 || out != "" {
			t.Fatalf("%s: got %d %q", how, code, out)
		}
		if entries := assertQueue(t, w, 1); string(entries[0]) != expectedBody("DEL", env, conf) {
			t.Errorf("%s: queued %s", how, entries[0])
		}
	}
}

func TestTimeoutBoundsTheWholeExchange(t *testing.T) {
	trickle := func(conn net.Conn, release <-chan struct{}) {
		// A byte at a time: no single read waits long, only a deadline stops this.
		for _, b := range []byte(response(200, addResult)) {
			select {
			case <-release:
				return
			default:
			}
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			<-time.After(20 * time.Millisecond)
		}
	}
	for _, reply := range []func(net.Conn, <-chan struct{}){hang, trickle} {
		for _, command := range []string{"ADD", "CHECK", "GC"} {
			w := newWorld(t)
			w.daemon.behave(reply)
			conf := w.config("1.0.0", map[string]interface{}{"timeout": 0.2})
			code, out := run(cniEnv(command), conf)
			if e := mustFail(t, code, out, 11, "1.0.0"); !strings.Contains(e.Details, "timeout") {
				t.Errorf("%s: %+v", command, e)
			}
			if len(w.daemon.received()) != 1 { // it was sent, then no answer came
				t.Errorf("%s: %d requests", command, len(w.daemon.received()))
			}
		}
		w := newWorld(t)
		w.daemon.behave(reply)
		conf := w.config("1.0.0", map[string]interface{}{"timeout": 0.2})
		if code, out := run(cniEnv("DEL"), conf); code != 0 || out != "" {
			t.Errorf("DEL: got %d %q", code, out)
		}
		assertQueue(t, w, 1)
	}
}

// --- the DEL queue ---------------------------------------------------------------------

// assertQueue checks the queue holds count well-formed entries and nothing
// else; returns their contents.
func assertQueue(t *testing.T, w *world, count int) [][]byte {
	t.Helper()
	dir := filepath.Join(w.stateDir(), queueDir)
	entries, err := os.ReadDir(dir)
	if count == 0 && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := os.Stat(dir); info.Mode().Perm() != 0o700 {
		t.Errorf("queue dir mode %v", info.Mode())
	}
	var contents [][]byte
	for _, entry := range entries {
		var stamp, pid int64
		var rest string
		n, _ := fmt.Sscanf(entry.Name(), "%d-%d%s", &stamp, &pid, &rest)
		if n != 3 || rest != ".json" || pid != int64(os.Getpid()) {
			t.Errorf("queue entry named %s", entry.Name())
		}
		if info, _ := entry.Info(); info.Mode() != 0o600 {
			t.Errorf("queue entry mode %v", info.Mode())
		}
		data, err := os.ReadFile(filepath.Join(dir, entry.Name()))
		if err != nil {
			t.Fatal(err)
		}
		contents = append(contents, data)
	}
	if len(contents) != count {
		t.Fatalf("%d queue entries, want %d", len(contents), count)
	}
	return contents
}

func TestRepeatedDelsQueueSeparateEntries(t *testing.T) {
	w := newWorld(t)
	w.daemon.stop()
	for i := 0; i < 3; i++ {
		if code, out := run(cniEnv("DEL"), w.config("1.0.0", nil)); code != 0 || out != "" {
			t.Fatalf("got %d %q", code, out)
		}
	}
	assertQueue(t, w, 3)
}

func TestDelThatCannotBeQueuedAsksForRetry(t *testing.T) {
	w := newWorld(t)
	w.daemon.stop()
	if err := os.WriteFile(w.stateDir(), []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := run(cniEnv("DEL"), w.config("0.4.0", nil))
	e := mustFail(t, code, out, 11, "0.4.0")
	if !strings.Contains(e.Msg, "could not be queued") || !strings.Contains(e.Details, "d.sock") ||
		!strings.Contains(e.Details, "not a directory") {
		t.Errorf("%+v", e)
	}
}

func TestQueueCreatesMissingParents(t *testing.T) {
	w := newWorld(t)
	w.daemon.stop()
	stateDir := filepath.Join(w.dir, "a", "b", "state")
	conf := w.config("1.0.0", map[string]interface{}{"state_dir": stateDir})
	// Root-only whatever the umask: the daemon refuses a state dir, or a queue,
	// that others may write, and sets aside entries that are not root's alone.
	defer syscall.Umask(syscall.Umask(0))
	if code, out := run(cniEnv("DEL"), conf); code != 0 || out != "" {
		t.Fatalf("got %d %q", code, out)
	}
	entries, _ := os.ReadDir(filepath.Join(stateDir, queueDir))
	if len(entries) != 1 {
		t.Fatalf("queue: %v", entries)
	}
	for _, dir := range []string{"a", "a/b", "a/b/state", "a/b/state/" + queueDir} {
		if info, err := os.Stat(filepath.Join(w.dir, dir)); err != nil || info.Mode() != fs.ModeDir|0o700 {
			t.Errorf("%s: %v %v", dir, info.Mode(), err)
		}
	}
	if info, _ := entries[0].Info(); info.Mode() != 0o600 {
		t.Errorf("queue entry mode %v", info.Mode())
	}
}

func TestFailedWriteLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "1-2.json")
	if err := os.Mkdir(path, 0o700); err != nil { // rename onto a directory fails
		t.Fatal(err)
	}
	if err := writeAtomically(path, filepath.Join(dir, ".1-2.tmp"), []byte("{}")); err == nil {
		t.Fatal("no error")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != "1-2.json" {
		t.Errorf("left %v", entries)
	}
}

func TestWriteNeverTouchesAnotherWritersTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	tmp := filepath.Join(dir, ".1-2.tmp")
	if err := os.WriteFile(tmp, []byte("theirs"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeAtomically(filepath.Join(dir, "1-2.json"), tmp, []byte("{}")); err == nil {
		t.Fatal("no error")
	}
	if data, _ := os.ReadFile(tmp); string(data) != "theirs" {
		t.Errorf("their file now holds %q", data)
	}
}

// --- bad input ---------------------------------------------------------------------------

func TestUndecodableConfigIsCode6(t *testing.T) {
	for _, stdin := range []string{"", "   \n", `{"cniVersion": "1.0.0"`,
		`{"cniVersion": "1.0.0"} x`, "[]", `"1.0.0"`, "null", "\xff\xfe{}", `{"a": 01}`,
		"\xef\xbb\xbf{\"cniVersion\": \"1.0.0\"}", strings.Repeat("[", 100000),
		`{"cniVersion": "1.0.0", "timeout": NaN}`, "{\"cniVersion\": \"1.0.0\", \"x\": \"\xff\"}"} {
		code, out := run(cniEnv("ADD"), stdin)
		mustFail(t, code, out, 6, "1.1.0")
	}
}

func TestUnsupportedCNIVersionIsCode1(t *testing.T) {
	for _, v := range []interface{}{"0.2.0", "0.1.0", "2.0.0", "", 1.0, []string{"1.0.0"},
		json.RawMessage("null"), nil} { // nil: no cniVersion at all
		w := newWorld(t)
		conf := w.config("1.0.0", map[string]interface{}{"cniVersion": v})
		code, out := run(cniEnv("ADD"), conf)
		mustFail(t, code, out, 1, "1.1.0")
		if len(w.daemon.received()) != 0 {
			t.Errorf("%v: sent", v)
		}
	}
}

func TestUnknownOrMissingCommandIsCode4(t *testing.T) {
	for _, command := range []string{"", "FOO", "add", "VERSION "} {
		w := newWorld(t)
		code, out := run(cniEnv(command), "not even JSON")
		if e := mustFail(t, code, out, 4, "1.1.0"); !strings.Contains(e.Msg, "CNI_COMMAND") {
			t.Errorf("%q: %+v", command, e)
		}
		code, out = run(cniEnv(command), w.config("0.4.0", nil))
		mustFail(t, code, out, 4, "0.4.0")
		if len(w.daemon.received()) != 0 {
			t.Errorf("%q: sent", command)
		}
	}
}

func TestStdinLimitIsExact(t *testing.T) {
	head := `{"cniVersion": "1.0.0", "pad": "`
	fits := head + strings.Repeat("x", maxStdin-len(head)-2) + `"}`
	if _, _, err := readConfig(strings.NewReader(fits)); err != nil {
		t.Errorf("%d bytes: %v", len(fits), err)
	}
	code, out := run(cniEnv("ADD"), fits+" ")
	mustFail(t, code, out, 4, "1.1.0")
}

func TestBodyOverLimitIsRefusedWithoutSending(t *testing.T) {
	w := newWorld(t)
	head := w.config("1.0.0", nil)
	head = head[:len(head)-1] + `, "pad": "`
	stdin := head + strings.Repeat("x", maxStdin-len(head)-2-300) + `"}`       // fits on stdin
	env := cniEnv("ADD", "CNI_ARGS", "K8S_POD_NAME="+strings.Repeat("p", 400)) // the body does not
	code, out := run(env, stdin)
	if e := mustFail(t, code, out, 4, "1.0.0"); !strings.Contains(e.Msg, "too large") {
		t.Errorf("%+v", e)
	}
	if len(w.daemon.received()) != 0 {
		t.Error("sent")
	}
}

func TestInvalidPluginKeysAreCode7(t *testing.T) {
	for _, c := range []struct {
		key   string
		value interface{}
	}{
		{"timeout", "5"}, {"timeout", true}, {"timeout", 0}, {"timeout", -1},
		{"timeout", 110.5}, {"timeout", 3600}, {"timeout", []int{5}}, {"timeout", json.RawMessage("1e400")},
		{"daemon_socket", 5}, {"daemon_socket", ""}, {"daemon_socket", "relative.sock"},
		{"daemon_socket", "/" + strings.Repeat("x", 107)}, {"daemon_socket", "/run/\x00x"},
		{"daemon_socket", json.RawMessage(`"/run/\ud800.sock"`)},
		{"state_dir", map[string]int{}}, {"state_dir", ""}, {"state_dir", "var/lib"},
	} {
		w := newWorld(t)
		code, out := run(cniEnv("ADD"), w.config("0.3.0", map[string]interface{}{c.key: c.value}))
		if e := mustFail(t, code, out, 7, "0.3.0"); !strings.Contains(e.Msg, c.key) {
			t.Errorf("%s %v: %+v", c.key, c.value, e)
		}
		if len(w.daemon.received()) != 0 {
			t.Errorf("%s %v: sent", c.key, c.value)
		}
	}
}

func TestValidTimeouts(t *testing.T) {
	for _, timeout := range []interface{}{110, 0.25, json.RawMessage("null")} {
		w := newWorld(t)
		code, out := run(cniEnv("GC"), w.config("1.1.0", map[string]interface{}{"timeout": timeout}))
		if code != 0 || out != "" {
			t.Errorf("%v: got %d %q", timeout, code, out)
		}
	}
}

func TestDefaultsWhenKeysAreAbsentOrNull(t *testing.T) {
	want := settings{defaultSocket, defaultTimeout * time.Second, defaultStateDir}
	for _, config := range []string{`{"cniVersion": "1.0.0"}`,
		`{"cniVersion": "1.0.0", "daemon_socket": null, "timeout": null, "state_dir": null}`} {
		conf, err := decodeObject([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := loadSettings(conf, false, &nodeAllowance{}); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v %v", config, got, err)
		}
	}
}

// --- the boundary ------------------------------------------------------------------------

func TestPanicBecomesCode999(t *testing.T) {
	var out bytes.Buffer
	getenv := func(string) string { panic("kaboom") }
	code := dispatch(getenv, strings.NewReader(`{"cniVersion": "0.3.1"}`), &out, "")
	if e := mustFail(t, code, out.String(), 999, "0.3.1"); e.Details != "kaboom" {
		t.Errorf("%+v", e)
	}
}
