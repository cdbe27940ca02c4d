"""The CNI worker process: serves the CNI API on the sockets its parent opened."""

import threading

import cotyledon
import setproctitle
from oslo_log import log as logging

from kuryr_cni import ownership
from kuryr_cni import podlock
from kuryr_cni import state
from kuryr_cni import version
from kuryr_cni.daemon import api
from kuryr_cni.daemon import server

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: cni-worker'


def build_ownership(conf, registry):
    state_dir = conf.cni_daemon.state_dir
    return ownership.Ownership(
        registry=registry,
        store=state.BindingStore(state_dir),
        locks=podlock.PodLocks(state.ensure_dir(state_dir + '/locks')),
        vif_timeout=conf.cni_daemon.vif_timeout)


class CNIWorker(cotyledon.Service):
    """One of ``worker_count`` pre-forked workers.

    ``run`` serves until ``terminate``; ``terminate`` stops accepting at once and
    waits for requests in flight (bounded by the request timeout) before the
    process exits 0. An exception in ``run`` ends the process with status 1
    and cotyledon starts a replacement.
    """

    name = 'cni-worker'

    def __init__(self, worker_id, conf, registry, sockets):
        super().__init__(worker_id)
        self.conf = conf
        self.registry = registry
        self.sockets = sockets
        self.servers = []

    def run(self):
        setproctitle.setproctitle(TITLE)
        app = api.CNIApp(build_ownership(self.conf, self.registry), self.registry,
                         self.conf.cni_daemon.request_timeout)
        inspect = api.InspectApp(self.registry, version.VERSION)
        self.servers = [server.BoundedServer(sock, api.CNIHandler,
                                             self.conf.cni_daemon.worker_concurrency,
                                             app=app, inspect=inspect)
                        for sock in self.sockets]
        for extra in self.servers[1:]:     # the optional TCP listener
            threading.Thread(target=extra.serve_forever, daemon=True).start()
        self.servers[0].serve_forever()

    def terminate(self):
        for srv in self.servers:
            if not srv.stop(drain_timeout=self.conf.cni_daemon.request_timeout):
                LOG.warning('Exiting with %d requests still in flight', srv.active)
