#!/bin/bash
# shellcheck shell=bash
#
# DevStack plugin for kuryr-cni.
#
#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.
#
# Enable in local.conf, after kuryr-kubernetes' plugin (whose kuryr-controller
# writes the KuryrPorts; its own CNI daemon, kuryr-daemon, stays disabled: this
# daemon is the CNI), with
#
#     enable_plugin kuryr-cni <repository URL> [branch]
#     enable_service kuryr-cni-daemon
#
# DevStack sources this file (it is never executed) once per phase, with the
# mode and the phase as arguments, after devstack/settings:
#
#     stack install      check the Kubernetes settings, install the package in
#                        its own virtualenv, build and install the CNI shim
#     stack post-config  write kuryr-controller's kuryr.conf (kuryr-kubernetes'
#                        plugin does only with its kuryr-daemon), the daemon's
#                        config file and the CNI conflist
#     stack extra        start kuryr-cni-daemon, wait until /ready answers 200
#     stack test-config  with KURYR_CNI_SMOKE_TEST=True: start a pod, prove
#                        kuryr-cni plumbed the port kuryr-controller made and
#                        Neutron turned ACTIVE, delete it
#     unstack            stop kuryr-cni-daemon
#     clean              remove everything "stack" installed or wrote
#
# Being sourced, it must never call `exit`: failures go through `die`.

# Save trace setting
_XTRACE_KURYR_CNI=$(set +o | grep xtrace)
set -o xtrace


# The absolute path of the daemon's console script.
function kuryr_cni_daemon_bin {
    echo "$KURYR_CNI_VENV/bin/kuryr-cni-daemon"
}

# http://<host>:$2$3, reaching from this host a server bound to address $1.
function kuryr_cni_local_url {
    local host=$1
    case "$host" in
        # The daemon's "::" serves IPv4 too, and is 0.0.0.0 where IPv6 is off.
        ''|0.0.0.0|::|'[::]') host=127.0.0.1 ;;
        \[*) ;;
        *:*) host="[$host]" ;;
    esac
    echo "http://${host}:$2$3"
}

function kuryr_cni_ready_url {
    kuryr_cni_local_url "$KURYR_CNI_HEALTH_HOST" "$KURYR_CNI_HEALTH_PORT" /ready
}

# Copy $1 to $2 with mode $3 so that readers see either the old file or the
# whole new one: the runtime may read the conflist at any moment.
function kuryr_cni_install_atomic {
    local src=$1 dst=$2 mode=$3
    local tmp
    tmp="$(dirname "$dst")/.$(basename "$dst").tmp.$$"
    sudo install -m "$mode" "$src" "$tmp" || die $LINENO "Cannot write $tmp"
    sudo mv -f "$tmp" "$dst" || die $LINENO "Cannot move $tmp to $dst"
}

# What the kubeadm of devstack-plugin-container (k8s-master, k8s-node) or of
# kuryr-kubernetes (kubernetes-master, kubernetes-worker) needs, checked before
# it runs (in a later phase).
function check_kuryr_cni_kubernetes_settings {
    if is_service_enabled kubernetes-master kubernetes-worker; then
        [[ "${CONTAINER_ENGINE:-}" == crio ]] || die $LINENO \
            "CONTAINER_ENGINE=${CONTAINER_ENGINE:-} (unset: docker): kubeadm from kuryr-kubernetes needs CONTAINER_ENGINE=crio"
    fi
    is_service_enabled k8s-master k8s-node || return 0
    # Their docker path points kubelet at dockershim, gone since Kubernetes 1.24.
    [[ "${CONTAINER_ENGINE:-}" == crio ]] || die $LINENO \
        "CONTAINER_ENGINE=${CONTAINER_ENGINE:-} (unset: docker): kubeadm from devstack-plugin-container needs CONTAINER_ENGINE=crio"
    [[ "${K8S_TOKEN:-}" =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] || die $LINENO \
        "K8S_TOKEN must be a kubeadm bootstrap token, [a-z0-9]{6}.[a-z0-9]{16} (kubeadm token generate): devstack-plugin-container's kubeadm init and join use it"
}

# kuryr-kubernetes' own CNI daemon would serve the same runtime, ports and
# node: only one may run.
function check_kuryr_cni_alone {
    if is_service_enabled kuryr-daemon; then
        die $LINENO "kuryr-daemon (kuryr-kubernetes' CNI daemon) is enabled: disable_service kuryr-daemon, kuryr-cni-daemon is the CNI"
    fi
}

# stack install
function install_kuryr_cni {
    check_kuryr_cni_alone
    check_kuryr_cni_kubernetes_settings

    # A virtualenv of its own, installed without OpenStack's upper-constraints:
    # a node daemon that imports no OpenStack service code, whose pyroute2 0.9
    # must not be forced onto (nor held back by) the services' environment.
    if [[ ! -x "$KURYR_CNI_VENV/bin/pip" ]]; then
        python3 -m venv "$KURYR_CNI_VENV" || die $LINENO "Cannot create $KURYR_CNI_VENV"
    fi
    "$KURYR_CNI_VENV/bin/pip" install --upgrade -e "$KURYR_CNI_HOME" || \
        die $LINENO "Cannot install $KURYR_CNI_HOME into $KURYR_CNI_VENV"

    # The CNI shim: a static executable built from shim/ (Go, offline),
    # replaced atomically: the runtime may exec it at any moment.
    install_package golang-go
    "$KURYR_CNI_HOME/tools/build-shim" || die $LINENO "Cannot build the CNI shim"
    sudo install -d -m 0755 "$KURYR_CNI_PLUGIN_DIR"
    kuryr_cni_install_atomic "$KURYR_CNI_HOME/shim/kuryr-cni" "$KURYR_CNI_PLUGIN_DIR/kuryr-cni" 0755
}

# Write the CNI network configuration list read by the container runtime.
function configure_kuryr_cni_conflist {
    local conflist=$KURYR_CNI_NETWORK_DIR/$KURYR_CNI_CONFLIST_NAME
    local tmp

    [[ "$KURYR_CNI_SHIM_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || \
        die $LINENO "KURYR_CNI_SHIM_TIMEOUT must be a whole number of seconds"

    sudo install -d -m 0755 "$KURYR_CNI_NETWORK_DIR"
    tmp=$(mktemp)
    python3 - "$KURYR_CNI_NETWORK_NAME" "$KURYR_CNI_SOCKET" \
        "$KURYR_CNI_SHIM_TIMEOUT" "$KURYR_CNI_STATE_DIR" > "$tmp" <<'EOF' || \
        die $LINENO "Cannot render the CNI conflist"
import json
import sys

name, socket, timeout, state_dir = sys.argv[1:]
json.dump({
    'cniVersion': '1.0.0',
    # A runtime whose libcni knows 1.1.0 picks it (STATUS, GC); libcni 1.1 keeps 1.0.0.
    'cniVersions': ['1.0.0', '1.1.0'],
    'name': name,
    'plugins': [{
        'type': 'kuryr-cni',
        'daemon_socket': socket,
        'timeout': int(timeout),
        'state_dir': state_dir,
    }],
}, sys.stdout, indent=2)
sys.stdout.write('\n')
EOF
    kuryr_cni_install_atomic "$tmp" "$conflist" 0644

    # The shim honours a socket or state dir other than its defaults only
    # where the root-owned allow file beside it lists them (doc/source/cni.rst).
    python3 -c 'import json, sys; json.dump({"daemon_socket": [sys.argv[1]],
        "state_dir": [sys.argv[2]]}, sys.stdout)' "$KURYR_CNI_SOCKET" \
        "$KURYR_CNI_STATE_DIR" > "$tmp" || die $LINENO "Cannot render the shim's allow file"
    sudo install -d -m 0755 "$KURYR_CNI_PLUGIN_DIR"
    kuryr_cni_install_atomic "$tmp" "$KURYR_CNI_PLUGIN_DIR/kuryr-cni-paths.json" 0644
    rm -f "$tmp"

    check_kuryr_cni_conflist_first
}

# Runtimes (CRI-O, containerd) use the first network configuration of their
# directory in lexical order: another one sorting before ours (flannel's
# 10-flannel.conflist, CRI-O's 10-crio-bridge.conflist, ...) would silently
# be the pod network instead.
function check_kuryr_cni_conflist_first {
    local first
    first=$(kuryr_cni_first_conflist)
    [[ "$first" == "$KURYR_CNI_CONFLIST_NAME" ]] || die $LINENO \
        "$KURYR_CNI_NETWORK_DIR/$first sorts before $KURYR_CNI_CONFLIST_NAME: the container runtime would use it. Remove it, or rename ours with KURYR_CNI_CONFLIST_NAME"
}

# The name of the configuration the runtime uses: the first by name.
function kuryr_cni_first_conflist {
    # Byte order, as libcni sorts (sort.Strings), whatever the locale.
    local LC_ALL=C
    local file
    for file in "$KURYR_CNI_NETWORK_DIR"/*; do
        case "$file" in
            *.conf|*.conflist|*.json) basename "$file"; return 0 ;;
        esac
    done
}

# kuryr-kubernetes' plugin writes kuryr-controller's kuryr.conf only when its
# kuryr-daemon service is enabled; with it disabled, this plugin has it written
# by the same functions, which that plugin (enabled before this one) defined.
function configure_kuryr_controller {
    is_service_enabled kuryr-kubernetes || return 0
    declare -F configure_kuryr >/dev/null || die $LINENO \
        "kuryr-kubernetes' plugin did not run before kuryr-cni's: put its enable_plugin line first"
    create_kuryr_account
    configure_kuryr
}

# stack post-config
function configure_kuryr_cni {
    local conf=$KURYR_CNI_CONF

    configure_kuryr_controller

    sudo install -d -o "$STACK_USER" -m 0755 "$(dirname "$conf")"
    # Start from an empty file on every stack: [[post-config|$KURYR_CNI_CONF]]
    # sections of local.conf are merged after this phase.
    install -m 0640 /dev/null "$conf" || die $LINENO "Cannot create $conf"

    iniset "$conf" DEFAULT debug "$ENABLE_DEBUG_LOG_LEVEL"

    iniset "$conf" cni_daemon node_name "$KURYR_CNI_NODE_NAME"
    iniset "$conf" cni_daemon socket "$KURYR_CNI_SOCKET"
    iniset "$conf" cni_daemon state_dir "$KURYR_CNI_STATE_DIR"
    iniset "$conf" cni_daemon worker_count "$KURYR_CNI_WORKER_COUNT"
    iniset "$conf" cni_daemon vif_timeout "$KURYR_CNI_VIF_TIMEOUT"
    iniset "$conf" cni_daemon vif_source "$KURYR_CNI_VIF_SOURCE"

    if [[ -z "$KURYR_CNI_KUBECONFIG$KURYR_CNI_K8S_API_ROOT$KURYR_CNI_KURYR_CONFIG" ]]; then
        die $LINENO "Set KURYR_CNI_KUBECONFIG or KURYR_CNI_K8S_API_ROOT (or KURYR_CNI_KURYR_CONFIG)"
    fi
    if [[ -n "$KURYR_CNI_KUBECONFIG" ]]; then
        iniset "$conf" kubernetes kubeconfig "$KURYR_CNI_KUBECONFIG"
    fi
    if [[ -n "$KURYR_CNI_K8S_API_ROOT" ]]; then
        iniset "$conf" kubernetes api_root "$KURYR_CNI_K8S_API_ROOT"
    fi
    if [[ -n "$KURYR_CNI_K8S_TOKEN_FILE" ]]; then
        iniset "$conf" kubernetes token_file "$KURYR_CNI_K8S_TOKEN_FILE"
    fi
    if [[ -n "$KURYR_CNI_K8S_CA_FILE" ]]; then
        iniset "$conf" kubernetes ca_file "$KURYR_CNI_K8S_CA_FILE"
    fi

    iniset "$conf" binding ovsdb_connection "$KURYR_CNI_OVSDB_CONNECTION"
    iniset "$conf" binding bridges "$KURYR_CNI_BRIDGES"
    if [[ -n "$KURYR_CNI_LINK_IFACE" ]]; then
        iniset "$conf" binding link_iface "$KURYR_CNI_LINK_IFACE"
    fi

    iniset "$conf" health host "$KURYR_CNI_HEALTH_HOST"
    iniset "$conf" health port "$KURYR_CNI_HEALTH_PORT"
    iniset "$conf" prometheus host "$KURYR_CNI_PROMETHEUS_HOST"
    iniset "$conf" prometheus port "$KURYR_CNI_PROMETHEUS_PORT"

    # The daemon and the shim share this directory (bindings, the shim's DEL
    # queue); both run as root.
    sudo install -d -m 0700 "$KURYR_CNI_STATE_DIR"

    configure_kuryr_cni_conflist
}

# Poll GET /ready until it answers 2xx, for at most KURYR_CNI_READY_TIMEOUT
# seconds; die when it never does.
function wait_for_kuryr_cni_ready {
    local url
    url=$(kuryr_cni_ready_url)
    local deadline=$((SECONDS + KURYR_CNI_READY_TIMEOUT))

    echo "Waiting up to ${KURYR_CNI_READY_TIMEOUT}s for kuryr-cni-daemon at $url"
    until curl --silent --fail --noproxy '*' --max-time 5 --output /dev/null "$url"; do
        if (( SECONDS >= deadline )); then
            die $LINENO "kuryr-cni-daemon not ready after ${KURYR_CNI_READY_TIMEOUT}s ($url)"
        fi
        sleep 1
    done
    echo "kuryr-cni-daemon is ready"
}

# stack extra
function start_kuryr_cni {
    local daemon_bin
    daemon_bin=$(kuryr_cni_daemon_bin)
    [[ -x "$daemon_bin" ]] || die $LINENO "$daemon_bin is missing; did 'stack install' run?"

    # The socket directory: root only (DESIGN.md 4.2).
    sudo install -d -m 0700 "$(dirname "$KURYR_CNI_SOCKET")"

    # kuryr-kubernetes' plugin installs its own kuryr-cni executable under the
    # same name: the runtime must run ours.
    cmp -s "$KURYR_CNI_HOME/shim/kuryr-cni" "$KURYR_CNI_PLUGIN_DIR/kuryr-cni" || die $LINENO \
        "$KURYR_CNI_PLUGIN_DIR/kuryr-cni is not kuryr-cni's shim: enable_plugin kuryr-cni after kuryr-kubernetes"

    # As root (group and user): netlink in pod namespaces and setns(2) need
    # CAP_NET_ADMIN and CAP_SYS_ADMIN. kuryr-controller's kuryr.conf first: the
    # same API server and credentials ([kubernetes]), as kuryr-daemon read them;
    # the daemon's own file after it, whose options win.
    run_process kuryr-cni-daemon \
        "$daemon_bin ${KURYR_CNI_KURYR_CONFIG:+--config-file $KURYR_CNI_KURYR_CONFIG }--config-file $KURYR_CNI_CONF" \
        root root

    wait_for_kuryr_cni_ready
}

# unstack
function stop_kuryr_cni {
    stop_process kuryr-cni-daemon
}

# Remove directory $1, with what it holds, if its name says it is ours: a
# mistyped setting must not turn "clean" into `rm -rf /var/lib`.
function kuryr_cni_remove_dir {
    local dir=$1
    [[ -e "$dir" ]] || return 0
    if [[ "$dir" != /* || "$(basename "$dir")" != *kuryr* ]]; then
        echo "WARNING: not removing $dir: not a kuryr-cni directory" >&2
        return 0
    fi
    sudo rm -rf -- "$dir"
}

# clean
function cleanup_kuryr_cni {
    sudo rm -f -- "$KURYR_CNI_PLUGIN_DIR/kuryr-cni" "$KURYR_CNI_PLUGIN_DIR/kuryr-cni-paths.json" \
        "$KURYR_CNI_NETWORK_DIR/$KURYR_CNI_CONFLIST_NAME"
    sudo rm -f -- "$KURYR_CNI_CONF"
    # Only if empty: an operator may keep other files (a kubeconfig) there.
    sudo rmdir --ignore-fail-on-non-empty -- "$(dirname "$KURYR_CNI_CONF")" 2>/dev/null || true
    kuryr_cni_remove_dir "$KURYR_CNI_STATE_DIR"
    sudo rm -f -- "$KURYR_CNI_SOCKET"
    kuryr_cni_remove_dir "$KURYR_CNI_RUN_DIR"
    kuryr_cni_remove_dir "$KURYR_CNI_VENV"
}

# stack test-config, with KURYR_CNI_SMOKE_TEST=True: a real pod on this node
# gets its network from kuryr-cni, on the port kuryr-controller made for it.
# Proven by what only kuryr-cni does: the host end of the pod's eth0 carries
# the owner tag naming the sandbox the runtime made, and the daemon's metrics
# counted a successful ADD; and by what only a plugged port gets: Neutron says
# the pod's port is ACTIVE (the ADD answers only once it is). Then the pod is
# deleted: its host device must go with it, and kuryr-controller its port.
function kuryr_cni_smoke_test {
    local pod=kuryr-cni-smoke
    local timeout=${KURYR_CNI_SMOKE_TIMEOUT}s
    local sandbox adds uid status deadline

    [[ "$KURYR_CNI_VIF_SOURCE" == kuryrport ]] || die $LINENO \
        "The smoke test's pod gets its VIF from kuryr-controller: set KURYR_CNI_VIF_SOURCE=kuryrport"
    is_service_enabled kuryr-kubernetes || die $LINENO \
        "The smoke test's pod gets its VIF from kuryr-controller: enable_service kuryr-kubernetes"
    check_kuryr_cni_conflist_first
    kubectl wait --for=condition=Ready "node/$KURYR_CNI_NODE_NAME" --timeout="$timeout" || \
        die $LINENO "Node $KURYR_CNI_NODE_NAME not Ready after $timeout"
    kuryr_cni_smoke_pod "$pod" | kubectl apply -f - || die $LINENO "Cannot create pod $pod"
    kubectl wait --for=condition=Ready "pod/$pod" --timeout="$timeout" || \
        die $LINENO "Pod $pod not Ready after $timeout"
    uid=$(kubectl get pod "$pod" --output 'jsonpath={.metadata.uid}') || \
        die $LINENO "Cannot read the UID of pod $pod"

    sandbox=$(sudo crictl --runtime-endpoint "$KURYR_CNI_CRI_ENDPOINT" pods --name "^$pod\$" \
        --namespace default --state ready --quiet)
    [[ "$sandbox" =~ ^[0-9a-f]{64}$ ]] || \
        die $LINENO "Expected the one ready sandbox of pod $pod, crictl says: $sandbox"
    [[ -n "$(kuryr_cni_devices_of "$sandbox")" ]] || \
        die $LINENO "No host device carries the owner tag kuryr-cni:$sandbox:eth0"
    adds=$(kuryr_cni_successful_adds)
    (( adds >= 1 )) || die $LINENO "kuryr_cni_requests_total counts no successful ADD"
    status=$(kuryr_cni_port_status "$uid")
    [[ "$status" == ACTIVE ]] || \
        die $LINENO "The Neutron port of pod $pod (device $uid) is ${status:-missing}, not ACTIVE"
    echo "kuryr-cni plumbed pod $pod: sandbox $sandbox, port ACTIVE, $adds successful ADDs"

    kubectl delete pod "$pod" --wait --timeout="$timeout" || die $LINENO "Cannot delete pod $pod"
    [[ -z "$(kuryr_cni_devices_of "$sandbox")" ]] || \
        die $LINENO "The host device of sandbox $sandbox outlived pod $pod"
    deadline=$((SECONDS + KURYR_CNI_SMOKE_TIMEOUT))
    until [[ -z "$(kuryr_cni_port_status "$uid")" ]]; do
        (( SECONDS < deadline )) || \
            die $LINENO "The Neutron port of pod $pod outlived it by $timeout"
        sleep 1
    done
}

# The status of the Neutron port of device (pod UID) $1; nothing if it has none.
function kuryr_cni_port_status {
    openstack --os-cloud "$KURYR_CNI_OS_CLOUD" port list --device-id "$1" \
        --format value --column Status
}

# The smoke test's pod, named $1: an ordinary pod, whose port kuryr-controller
# makes.
function kuryr_cni_smoke_pod {
    cat <<POD
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
spec:
  nodeName: $KURYR_CNI_NODE_NAME
  terminationGracePeriodSeconds: 0
  tolerations:
    - operator: Exists
  containers:
    - name: pause
      image: $KURYR_CNI_SMOKE_IMAGE
POD
}

# Names of the host devices whose owner tag (IFLA_IFALIAS) is eth0 of sandbox $1.
function kuryr_cni_devices_of {
    ip -j link show | python3 -c '
import json
import sys
owner = "kuryr-cni:%s:eth0" % sys.argv[1]
for link in json.load(sys.stdin):
    if link.get("ifalias") == owner:
        print(link["ifname"])
' "$1"
}

# kuryr_cni_requests_total{command="ADD",result="success"}, from /metrics.
function kuryr_cni_successful_adds {
    local url
    url=$(kuryr_cni_local_url "$KURYR_CNI_PROMETHEUS_HOST" "$KURYR_CNI_PROMETHEUS_PORT" /metrics)
    curl --silent --fail --noproxy '*' --max-time 10 "$url" | python3 -c '
import re
import sys
sample = re.search(r"^kuryr_cni_requests_total\{(?=[^}]*command=\"ADD\")"
                   r"(?=[^}]*result=\"success\")[^}]*\} (\S+)$", sys.stdin.read(), re.M)
print(int(float(sample.group(1))) if sample else 0)
'
}

if is_service_enabled kuryr-cni-daemon; then
    if [[ "$1" == "stack" && "${2:-}" == "install" ]]; then
        echo_summary "Installing kuryr-cni"
        install_kuryr_cni
    elif [[ "$1" == "stack" && "${2:-}" == "post-config" ]]; then
        echo_summary "Configuring kuryr-cni"
        configure_kuryr_cni
    elif [[ "$1" == "stack" && "${2:-}" == "extra" ]]; then
        echo_summary "Starting kuryr-cni-daemon"
        start_kuryr_cni
    elif [[ "$1" == "stack" && "${2:-}" == "test-config" ]]; then
        if [[ "$KURYR_CNI_SMOKE_TEST" == "True" ]] && \
                is_service_enabled k8s-master kubernetes-master; then
            echo_summary "Proving that kuryr-cni plumbs a pod"
            kuryr_cni_smoke_test
        fi
    fi

    if [[ "$1" == "unstack" ]]; then
        stop_kuryr_cni
    fi

    if [[ "$1" == "clean" ]]; then
        cleanup_kuryr_cni
    fi
fi

# Restore xtrace
$_XTRACE_KURYR_CNI
