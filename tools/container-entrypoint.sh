#!/bin/bash
# Entrypoint of the kuryr-cni daemon image (Dockerfile), run by the DaemonSet in
# etc/kubernetes/kuryr-cni-daemonset.yaml:
#
#  1. installs the CNI shim, a static executable, into the host's CNI bin dir
#     (mounted from the host),
#  2. installs the CNI network config, when the ConfigMap carries one,
#  3. names this node from the downward API (the ConfigMap is shared by every
#     node, so it cannot), and
#  4. execs the daemon, so that it is PID 1 and receives the kubelet's SIGTERM.
#
# Files are replaced atomically (temporary name, then rename): the runtime may
# exec the shim or read the config at any moment, and overwriting a running
# executable fails with ETXTBSY. The shim runs on the host and needs nothing
# there but the daemon's socket and state directories.
#
# Environment (defaults in brackets):
#   CNI_BIN_DIR           host CNI bin dir as mounted here [/host/opt/cni/bin]
#   CNI_CONF_DIR          host CNI config dir as mounted here [/host/etc/cni/net.d]
#   KURYR_CNI_SHIM        the shim shipped in the image [/opt/cni-bin-stage/kuryr-cni]
#   KURYR_CNI_CONFIG      daemon config [/etc/kuryr-cni/kuryr-cni.conf]
#   KURYR_CNI_CONFLIST    CNI config to install; skipped when missing
#                         [/etc/kuryr-cni/10-kuryr.conflist]
#   KURYR_CNI_SHIM_PATHS  the shim's allow file of non-default socket and state
#                         dir paths (doc/source/cni.rst), installed beside it;
#                         skipped when missing [/etc/kuryr-cni/kuryr-cni-paths.json]
#   KURYR_CNI_POD_CONFIG  where the per-node config is written
#                         [${TMPDIR:-/tmp}/kuryr-cni-node.conf]
#   NODE_NAME             this node's name (downward API: spec.nodeName)
#   KURYR_CNI_DAEMON      the daemon command [kuryr-cni-daemon]
# Arguments are passed on to the daemon.

set -o errexit -o nounset -o pipefail

CNI_BIN_DIR=${CNI_BIN_DIR:-/host/opt/cni/bin}
CNI_CONF_DIR=${CNI_CONF_DIR:-/host/etc/cni/net.d}
KURYR_CNI_SHIM=${KURYR_CNI_SHIM:-/opt/cni-bin-stage/kuryr-cni}
KURYR_CNI_CONFIG=${KURYR_CNI_CONFIG:-/etc/kuryr-cni/kuryr-cni.conf}
KURYR_CNI_CONFLIST=${KURYR_CNI_CONFLIST:-/etc/kuryr-cni/10-kuryr.conflist}
KURYR_CNI_SHIM_PATHS=${KURYR_CNI_SHIM_PATHS:-/etc/kuryr-cni/kuryr-cni-paths.json}
KURYR_CNI_POD_CONFIG=${KURYR_CNI_POD_CONFIG:-${TMPDIR:-/tmp}/kuryr-cni-node.conf}
KURYR_CNI_DAEMON=${KURYR_CNI_DAEMON:-kuryr-cni-daemon}
NODE_NAME=${NODE_NAME:-}

log() {
    echo "kuryr-cni-entrypoint: $*" >&2
}

# install_atomic SRC DST MODE
install_atomic() {
    local src=$1 dst=$2 mode=$3
    local tmp
    tmp="$(dirname "${dst}")/.$(basename "${dst}").tmp.$$"
    cp -- "${src}" "${tmp}"
    chmod "${mode}" "${tmp}"
    mv -f -- "${tmp}" "${dst}"
}

if [[ ! -f "${KURYR_CNI_SHIM}" ]]; then
    log "the shim ${KURYR_CNI_SHIM} is missing from the image"
    exit 1
fi
if [[ ! -d "${CNI_BIN_DIR}" ]]; then
    log "${CNI_BIN_DIR} is not mounted"
    exit 1
fi
install_atomic "${KURYR_CNI_SHIM}" "${CNI_BIN_DIR}/kuryr-cni" 0755
log "installed ${CNI_BIN_DIR}/kuryr-cni"
if [[ -f "${KURYR_CNI_SHIM_PATHS}" ]]; then
    install_atomic "${KURYR_CNI_SHIM_PATHS}" "${CNI_BIN_DIR}/kuryr-cni-paths.json" 0644
    log "installed ${CNI_BIN_DIR}/kuryr-cni-paths.json"
fi

if [[ -f "${KURYR_CNI_CONFLIST}" ]]; then
    if [[ ! -d "${CNI_CONF_DIR}" ]]; then
        log "${CNI_CONF_DIR} is not mounted"
        exit 1
    fi
    install_atomic "${KURYR_CNI_CONFLIST}" "${CNI_CONF_DIR}/$(basename "${KURYR_CNI_CONFLIST}")" 0644
    log "installed ${CNI_CONF_DIR}/$(basename "${KURYR_CNI_CONFLIST}")"
fi

# Read first, so that anything the ConfigMap sets explicitly wins.
{
    echo "# Written by ${0##*/} at container start."
    echo "[cni_daemon]"
    if [[ -n "${NODE_NAME}" ]]; then
        echo "node_name = ${NODE_NAME}"
    fi
} > "${KURYR_CNI_POD_CONFIG}"
if [[ -z "${NODE_NAME}" ]]; then
    log "NODE_NAME is not set; the daemon falls back to the hostname"
fi

exec "${KURYR_CNI_DAEMON}" --config-file "${KURYR_CNI_POD_CONFIG}" \
    --config-file "${KURYR_CNI_CONFIG}" "$@"
