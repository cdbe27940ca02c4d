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
# Enable in local.conf with
#
#     enable_plugin kuryr-cni <repository URL> [branch]
#     enable_service kuryr-cni-daemon
#
# DevStack sources this file (it is never executed) once per phase, with the
# mode and the phase as arguments, after devstack/settings:
#
#     stack install      pip-install the package, build and install the CNI shim
#     stack post-config  write the daemon's config file and the CNI conflist
#     stack extra        start kuryr-cni-daemon, wait until /ready answers 200
#     unstack            stop kuryr-cni-daemon
#     clean              remove everything "stack" installed or wrote
#
# Being sourced, it must never call `exit`: failures go through `die`.

# Save trace setting
_XTRACE_KURYR_CNI=$(set +o | grep xtrace)
set -o xtrace


# The absolute path of the daemon's console script.
function kuryr_cni_daemon_bin {
    echo "${KURYR_CNI_DAEMON_BIN:-$(get_python_exec_prefix)/kuryr-cni-daemon}"
}

# The URL of the readiness endpoint, reachable from this host whatever
# address the health server is bound to.
function kuryr_cni_ready_url {
    local host=$KURYR_CNI_HEALTH_HOST
    case "$host" in
        ''|0.0.0.0) host=127.0.0.1 ;;
        ::|'[::]') host='[::1]' ;;
        \[*) ;;
        *:*) host="[$host]" ;;
    esac
    echo "http://${host}:${KURYR_CNI_HEALTH_PORT}/ready"
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

# stack install
function install_kuryr_cni {
    setup_develop "$KURYR_CNI_HOME"

    # The CNI shim: a static executable built from shim/ (Go, offline),
    # replaced atomically: the runtime may exec it at any moment.
    install_package golang-go
    "$KURYR_CNI_HOME/tools/build-shim" || die $LINENO "Cannot build the CNI shim"
    sudo install -d -m 0755 "$CNI_BIN_DIR"
    kuryr_cni_install_atomic "$KURYR_CNI_HOME/shim/kuryr-cni" "$CNI_BIN_DIR/kuryr-cni" 0755
}

# Write the CNI network configuration list read by the container runtime.
function configure_kuryr_cni_conflist {
    local conflist=$CNI_CONF_DIR/$KURYR_CNI_CONFLIST_NAME
    local tmp

    [[ "$KURYR_CNI_SHIM_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || \
        die $LINENO "KURYR_CNI_SHIM_TIMEOUT must be a whole number of seconds"

    sudo install -d -m 0755 "$CNI_CONF_DIR"
    tmp=$(mktemp)
    python3 - "$KURYR_CNI_NETWORK_NAME" "$KURYR_CNI_SOCKET" \
        "$KURYR_CNI_SHIM_TIMEOUT" "$KURYR_CNI_STATE_DIR" > "$tmp" <<'EOF' || \
        die $LINENO "Cannot render the CNI conflist"
import json
import sys

name, socket, timeout, state_dir = sys.argv[1:]
json.dump({
    'cniVersion': '1.1.0',
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
    rm -f "$tmp"

    # Runtimes use the first configuration in lexical order: say so when
    # another one would shadow ours.
    local other
    for other in "$CNI_CONF_DIR"/*.conf "$CNI_CONF_DIR"/*.conflist "$CNI_CONF_DIR"/*.json; do
        [[ -e "$other" && "$other" != "$conflist" ]] || continue
        if [[ "$(basename "$other")" < "$KURYR_CNI_CONFLIST_NAME" ]]; then
            echo "WARNING: $other sorts before $conflist; the container runtime will use it instead" >&2
        fi
    done
}

# stack post-config
function configure_kuryr_cni {
    local conf=$KURYR_CNI_CONF

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

    if [[ -z "$KURYR_CNI_KUBECONFIG$KURYR_CNI_K8S_API_ROOT" ]]; then
        die $LINENO "Set KURYR_CNI_KUBECONFIG or KURYR_CNI_K8S_API_ROOT"
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

    # As root (group and user): netlink in pod namespaces and setns(2) need
    # CAP_NET_ADMIN and CAP_SYS_ADMIN.
    run_process kuryr-cni-daemon "$daemon_bin --config-file $KURYR_CNI_CONF" root root

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
    sudo rm -f -- "$CNI_BIN_DIR/kuryr-cni" "$CNI_CONF_DIR/$KURYR_CNI_CONFLIST_NAME"
    sudo rm -f -- "$KURYR_CNI_CONF"
    # Only if empty: an operator may keep other files (a kubeconfig) there.
    sudo rmdir --ignore-fail-on-non-empty -- "$(dirname "$KURYR_CNI_CONF")" 2>/dev/null || true
    kuryr_cni_remove_dir "$KURYR_CNI_STATE_DIR"
    sudo rm -f -- "$KURYR_CNI_SOCKET"
    kuryr_cni_remove_dir "$KURYR_CNI_RUN_DIR"
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
