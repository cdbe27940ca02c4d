// Command kuryr-cni is the CNI executable the container runtime runs for every
// pod sandbox operation (DESIGN §4.1, §4.2).
//
// It answers VERSION itself and forwards ADD, DEL, CHECK, GC and STATUS to
// the kuryr-cni daemon as HTTP/1.1 over the daemon's unix socket, with the
// network config passed through as the runtime wrote it. ADD, CHECK and
// STATUS wait, bounded, for a daemon out of reach (wait.go). A DEL the daemon
// did not answer is queued durably under the state dir and reported as a
// success: the daemon replays the queue. The config's paths are honoured only
// where the node allows them (allow.go), and its timeout is bounded.
//
// main only hands over to dispatch, which takes the environment, stdin and
// stdout as parameters. Steps return ordinary errors or a *cniError; dispatch
// is the one place where an error becomes CNI error JSON on stdout. Standard
// library only, and as little of it as will do: every package's start-up is
// paid once per pod (net/http alone would double it), which is why daemon.go
// reads the daemon's answer itself.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"
)

// version is set by tools/build-shim from kuryr_cni/version.py.
var version = "unknown"

// supportedVersions are the CNI spec versions spoken, oldest first; they are
// kuryr_cni.cni.SUPPORTED_VERSIONS (a unit test compares the two sources).
var supportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// routes maps each forwarded command to the daemon's path; the reverse of
// kuryr_cni.daemon.api.ROUTES (a unit test compares the two sources).
var routes = map[string]string{
	"ADD":    "/addNetwork",
	"DEL":    "/delNetwork",
	"CHECK":  "/checkNetwork",
	"GC":     "/gc",
	"STATUS": "/status",
}

// envKeys are the variables forwarded to the daemon, in the body's order.
var envKeys = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS",
	"CNI_PATH"}

// Defaults of the plugin entry's keys (DESIGN §4.1).
const (
	defaultTimeout = 110            // seconds: under kubelet's 120
	maxTimeout     = defaultTimeout // the runtime gives up at 120 s anyway
)

// The default paths: variables only so that the package's tests can run
// without the node's own.
var (
	defaultSocket   = "/run/kuryr-cni/daemon.sock"
	defaultStateDir = "/var/lib/kuryr-cni"
)

// Bounds on everything read or sent.
const (
	maxStdin    = 1 << 20 // the network config from the runtime
	maxBody     = 1 << 20 // a request body the daemon accepts
	maxResponse = 4 << 20 // a whole HTTP response from the daemon
	sunPathMax  = 107     // sockaddr_un.sun_path, less its NUL
)

// CNI error codes used here (CNI spec, "Error codes").
const (
	codeIncompatibleVersion = 1
	codeInvalidEnvironment  = 4
	codeIOFailure           = 5
	codeDecodingFailure     = 6
	codeInvalidConfig       = 7
	codeTryAgainLater       = 11
	codePluginNotAvailable  = 50
	codeUnexpected          = 999
)

// jsonSpace is what JSON allows around a document.
const jsonSpace = " \t\r\n"

// cniError is an error as the runtime sees it: {cniVersion, code, msg, details}.
type cniError struct {
	Code    int    `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

func (e *cniError) Error() string {
	return e.Msg + ": " + e.Details
}

// settings are the plugin entry's keys the shim itself uses.
type settings struct {
	socket   string
	timeout  time.Duration
	stateDir string
}

// netConf is the network config from stdin: its top-level keys, undecoded.
type netConf map[string]json.RawMessage

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(version)
		return
	}
	os.Exit(dispatch(os.Getenv, os.Stdin, os.Stdout, allowFilePath()))
}

// dispatch runs one CNI operation and returns the exit status: the error
// boundary. A success prints its result (if any), the daemon's own CNI error
// is printed unchanged, any other error is printed as CNI error JSON in the
// request's cniVersion when it is one we speak, and a panic becomes code 999
// rather than a stack trace. Stdin is forwarded without being re-encoded.
// allowFile is the node's allow file (allow.go).
func dispatch(getenv func(string) string, stdin io.Reader, stdout io.Writer,
	allowFile string) (status int) {
	cniVersion := supportedVersions[len(supportedVersions)-1]
	defer func() {
		if r := recover(); r != nil {
			status = writeError(stdout, cniVersion, &cniError{codeUnexpected,
				"unexpected error in the kuryr-cni shim", fmt.Sprint(r)})
		}
	}()
	raw, conf, confErr := readConfig(stdin)
	if requested, ok := requestedVersion(conf); ok {
		cniVersion = requested
	}
	out, err := execute(getenv, raw, conf, confErr, cniVersion, &nodeAllowance{path: allowFile})
	var refusal *daemonRefusal
	switch {
	case err == nil:
		return emit(stdout, out, 0)
	case errors.As(err, &refusal):
		return emit(stdout, refusal.answer, 1)
	default:
		var cniErr *cniError
		if !errors.As(err, &cniErr) {
			cniErr = &cniError{codeUnexpected, "unexpected error in the kuryr-cni shim",
				err.Error()}
		}
		return writeError(stdout, cniVersion, cniErr)
	}
}

// execute runs the command CNI_COMMAND names; the config's error counts only
// when the command needs the config.
func execute(getenv func(string) string, raw []byte, conf netConf, confErr error,
	cniVersion string, node *nodeAllowance) ([]byte, error) {
	command := getenv("CNI_COMMAND")
	if command == "VERSION" {
		return answerVersion(cniVersion), nil
	}
	if _, ok := routes[command]; !ok {
		return nil, unsupportedCommand(command)
	}
	if confErr != nil {
		return nil, confErr
	}
	s, err := loadSettings(conf, command == "DEL", node)
	if err != nil {
		return nil, err
	}
	body, err := buildBody(command, getenv, raw)
	if err != nil {
		return nil, err
	}
	out, err := forward(command, body, s)
	if command == "DEL" {
		return out, queueIfUnanswered(err, body, s.stateDir)
	}
	return out, err
}

func unsupportedCommand(command string) error {
	msg := "CNI_COMMAND is not set"
	if command != "" {
		msg = fmt.Sprintf("CNI_COMMAND %q is not supported", command)
	}
	return &cniError{codeInvalidEnvironment, msg, "supported: VERSION, ADD, DEL, CHECK, GC, STATUS"}
}

func answerVersion(cniVersion string) []byte {
	out, _ := json.Marshal(struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}{cniVersion, supportedVersions})
	return append(out, '\n')
}

// readConfig reads the network config from stdin: its bytes, and its keys
// when it is one JSON object of at most maxStdin bytes, else the error.
func readConfig(stdin io.Reader) ([]byte, netConf, error) {
	raw, err := io.ReadAll(io.LimitReader(stdin, maxStdin+1))
	if err != nil {
		return nil, nil, &cniError{codeIOFailure, "cannot read the network configuration from stdin",
			err.Error()}
	}
	if len(raw) > maxStdin {
		return nil, nil, &cniError{codeInvalidEnvironment, "network configuration too large",
			fmt.Sprintf("stdin holds more than %d bytes", maxStdin)}
	}
	raw = bytes.Trim(raw, jsonSpace)
	if len(raw) == 0 {
		return nil, nil, &cniError{codeDecodingFailure, "no network configuration on stdin", ""}
	}
	conf, err := decodeObject(raw)
	if err != nil {
		return nil, nil, &cniError{codeDecodingFailure, "network configuration is not a JSON object",
			err.Error()}
	}
	return raw, conf, nil
}

// decodeObject decodes one JSON object of UTF-8 text into its keys.
func decodeObject(data []byte) (netConf, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not UTF-8 text")
	}
	var conf netConf
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, err
	}
	if conf == nil {
		return nil, errors.New("null")
	}
	return conf, nil
}

// requestedVersion is the config's cniVersion, and whether we speak it.
func requestedVersion(conf netConf) (string, bool) {
	var requested string
	ok := json.Unmarshal(conf["cniVersion"], &requested) == nil && isSupported(requested)
	return requested, ok
}

func isSupported(cniVersion string) bool {
	for _, v := range supportedVersions {
		if v == cniVersion {
			return true
		}
	}
	return false
}

// loadSettings checks cniVersion and reads the keys the shim uses. A key
// that is absent or null takes its default. A path the node does not allow,
// or a timeout above maxTimeout, is refused (code 7), except for a DEL,
// which takes the default instead: a DEL must not be lost, and the default
// daemon (or the default state dir's queue, which that daemon replays) is
// the only one this node vouches for.
func loadSettings(conf netConf, isDel bool, node *nodeAllowance) (settings, error) {
	if _, ok := requestedVersion(conf); !ok {
		msg := "cniVersion is missing"
		if raw, present := conf["cniVersion"]; present {
			msg = fmt.Sprintf("cniVersion %s is not supported", raw)
		}
		return settings{}, &cniError{codeIncompatibleVersion, msg,
			"supported: " + strings.Join(supportedVersions, ", ")}
	}
	timeout, err := loadTimeout(conf, isDel)
	if err != nil {
		return settings{}, err
	}
	socket, err := loadAllowedPath(conf, "daemon_socket", defaultSocket, isDel, node)
	if err != nil {
		return settings{}, err
	}
	if len(socket) > sunPathMax {
		return settings{}, &cniError{codeInvalidConfig, `"daemon_socket" is too long for a unix socket`,
			fmt.Sprintf("at most %d bytes", sunPathMax)}
	}
	stateDir, err := loadAllowedPath(conf, "state_dir", defaultStateDir, isDel, node)
	if err != nil {
		return settings{}, err
	}
	return settings{socket, timeout, stateDir}, nil
}

func isAbsent(raw json.RawMessage) bool {
	return raw == nil || string(raw) == "null"
}

func loadTimeout(conf netConf, isDel bool) (time.Duration, error) {
	raw := conf["timeout"]
	if isAbsent(raw) {
		return defaultTimeout * time.Second, nil
	}
	var seconds float64
	valid := json.Unmarshal(raw, &seconds) == nil && seconds > 0
	if valid && seconds > maxTimeout && isDel {
		return defaultTimeout * time.Second, nil
	}
	if !valid || seconds > maxTimeout {
		return 0, &cniError{codeInvalidConfig,
			fmt.Sprintf(`"timeout" must be a number of seconds, above 0 and at most %d`, maxTimeout),
			fmt.Sprintf("got %.200s", raw)}
	}
	return time.Duration(seconds * float64(time.Second)), nil
}

// loadAllowedPath is loadPath, then the node's allowance of a non-default path.
func loadAllowedPath(conf netConf, key, fallback string, isDel bool,
	node *nodeAllowance) (string, error) {
	path, err := loadPath(conf, key, fallback)
	if err != nil || path == fallback {
		return path, err
	}
	refusal := node.permits(key, path)
	switch {
	case refusal == nil:
		return path, nil
	case isDel:
		return fallback, nil
	default:
		return "", &cniError{codeInvalidConfig,
			fmt.Sprintf("%q %s is not allowed on this node", key, path), refusal.Error()}
	}
}

// loadPath reads an absolute path. Go's JSON decoder turns an escaped lone
// surrogate into U+FFFD, so that rune stands for text no file name holds.
func loadPath(conf netConf, key, fallback string) (string, error) {
	raw := conf[key]
	if isAbsent(raw) {
		return fallback, nil
	}
	var path string
	if json.Unmarshal(raw, &path) != nil || !strings.HasPrefix(path, "/") ||
		strings.ContainsAny(path, "\x00\uFFFD") {
		return "", &cniError{codeInvalidConfig, fmt.Sprintf("%q must be an absolute path", key),
			fmt.Sprintf("got %.200s", raw)}
	}
	return path, nil
}

// buildBody is what the daemon receives (and the DEL queue keeps): the CNI_*
// variables, "" when unset, and "config", the network config exactly as the
// runtime wrote it (readConfig checked it is one JSON object).
func buildBody(command string, getenv func(string) string, config []byte) ([]byte, error) {
	var body bytes.Buffer
	body.WriteByte('{')
	for _, key := range envKeys {
		value := getenv(key)
		if key == "CNI_COMMAND" {
			value = command
		}
		quoted, _ := json.Marshal(value)
		body.WriteString(`"` + key + `":`)
		body.Write(quoted)
		body.WriteByte(',')
	}
	body.WriteString(`"config":`)
	body.Write(config)
	body.WriteByte('}')
	if body.Len() > maxBody {
		return nil, &cniError{codeInvalidEnvironment, "request to the kuryr-cni daemon too large",
			fmt.Sprintf("the body would be %d bytes; the limit is %d", body.Len(), maxBody)}
	}
	return body.Bytes(), nil
}

// writeError prints err as CNI error JSON; returns the exit status.
func writeError(stdout io.Writer, cniVersion string, err *cniError) int {
	out, _ := json.Marshal(struct {
		CNIVersion string `json:"cniVersion"`
		*cniError
	}{cniVersion, err})
	return emit(stdout, append(out, '\n'), 1)
}

// emit prints out, if any, and returns status: 1 when stdout fails, since
// an answer the runtime did not get is no success.
func emit(stdout io.Writer, out []byte, status int) int {
	if len(out) > 0 {
		if _, err := stdout.Write(out); err != nil {
			return 1
		}
	}
	return status
}
