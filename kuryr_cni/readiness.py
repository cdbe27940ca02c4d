"""When an ADD may answer: the signals that say a plugged pod's network works.

Two sources can say it, chosen by ``[cni_daemon] ready_signal``:

* ``active``: the VIF source's ``active`` flag (Neutron's ACTIVE, which
  kuryr-controller copies into the KuryrPort), read from the registry. It
  travels from OVN through Neutron, kuryr-controller's PATCH and the watch:
  seconds on a busy control plane.
* ``ovn-installed``: the node's own Open vSwitch database. ovn-controller
  sets ``external_ids:ovn-installed=true`` on the pod's Interface once every
  flow of the port, its ACLs included, is installed — the same event Neutron's
  ACTIVE is derived from, seen where it happens. Only ``ovs`` VIFs have it
  (:attr:`kuryr_cni.binding.base.Driver.installed_signal`).

:data:`FIRST` (the default) answers for each VIF on whichever comes first;
:data:`OVN_INSTALLED` waits for ovn-installed alone where a VIF has it (a
node whose VIF source never marks ports active), ``active`` elsewhere;
:data:`ACTIVE` ignores OVSDB (upstream kuryr's behaviour).

:class:`InstalledWatch` waits for ovn-installed in threads (one OVSDB "wait"
per VIF, held by the server: nothing polls) while the ADD's own thread waits
on the registry; either wakes it. This module decides nothing about
ownership and touches no device.
"""

import socket
import threading

from oslo_log import log as logging

from kuryr_cni import errors

LOG = logging.getLogger(__name__)

ACTIVE = 'active'
OVN_INSTALLED = 'ovn-installed'
FIRST = 'first'
SIGNALS = (ACTIVE, OVN_INSTALLED, FIRST)
# The watch outlives the ADD's own timeout by this much, so the ADD's timeout
# (with its message naming the inactive ports) is what the runtime sees.
WATCH_MARGIN = 1.0
JOIN_TIMEOUT = 5.0


class InstalledWatch:
    """Waits, in threads, until the agent has installed each of ``plugs``' ports.

    ``plugs`` maps a VIF's name (the registry's, ``eth0``...) to ``(vif,
    plug)``; ``kernel`` is the :class:`kuryr_cni.kernel.Kernel` port.
    :attr:`installed` holds the names whose signal came, :attr:`failures`
    the names whose wait failed (OVSDB unreachable...) with the error;
    :attr:`wake` is set at each of both. A context manager: leaving it ends
    the waits still running (their OVSDB connections are shut down).
    """

    def __init__(self, kernel, plugs, timeout):
        self.installed = set()
        self.failures = {}
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._sockets = []
        self._closed = False
        self._threads = [threading.Thread(target=self._watch, daemon=True,
                                          args=(kernel, name, vif, plug, timeout + WATCH_MARGIN),
                                          name='kuryr-cni-installed-%s' % name)
                         for name, (vif, plug) in plugs.items()]
        for thread in self._threads:
            thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:     # closed by its thread meanwhile
                pass
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)

    def _watch(self, kernel, name, vif, plug, timeout):
        def on_connect(sock):
            with self._lock:
                self._sockets.append(sock)
                closed = self._closed
            if closed:      # closed before this connection existed
                sock.shutdown(socket.SHUT_RDWR)
        try:
            kernel.wait_installed(vif, plug, timeout, on_connect)
        except errors.CNIError as exc:
            with self._lock:
                if self._closed:
                    return
                self.failures[name] = exc
            LOG.warning('Sandbox %s: no ovn-installed for %s (port %s): %s',
                        plug.container_id, plug.ifname, vif.port_id, exc.msg)
        else:
            with self._lock:
                self.installed.add(name)
            LOG.debug('Sandbox %s: OVN installed the flows of %s (port %s)',
                      plug.container_id, plug.ifname, vif.port_id)
        finally:
            with self._lock:
                self._sockets = [s for s in self._sockets if s.fileno() != -1]
        self.wake.set()


def is_ready(signal, name, vif, watched, watch):
    """Whether VIF ``name`` (as the registry now holds it) may be answered for.

    ``watched``: whether its installed signal is being watched; ``watch``:
    the :class:`InstalledWatch` (or None). Raises the watch's failure when
    ovn-installed alone may answer and its wait failed.
    """
    if not watched:
        return vif.active
    if name in watch.installed:
        return True
    if signal == OVN_INSTALLED:
        failure = watch.failures.get(name)
        if failure is not None:
            raise failure
        return False
    return vif.active
