"""The CNI worker process: serves the CNI API on the sockets its parent opened."""

import threading

import cotyledon
import setproctitle
from oslo_log import log as logging

from kuryr_cni import apiclient
from kuryr_cni import binding
from kuryr_cni import events
from kuryr_cni import kernel
from kuryr_cni import ownership
from kuryr_cni import podlock
from kuryr_cni import state
from kuryr_cni import version
from kuryr_cni.daemon import api
from kuryr_cni.daemon import heartbeat
from kuryr_cni.daemon import housekeeping
from kuryr_cni.daemon import server

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: cni-worker'


def build_ownership(conf, registry, events=None):
    state_dir = conf.cni_daemon.state_dir
    return ownership.Ownership(
        registry=registry,
        store=state.BindingStore(state_dir),
        locks=podlock.PodLocks(state.ensure_dir(state_dir + '/locks')),
        kernel=kernel.Kernel(binding_options=binding.Options.from_conf(conf)),
        vif_timeout=conf.cni_daemon.vif_timeout,
        events=events)


def build_event_poster(conf):
    """Kubernetes Events about pods whose ADD timed out (posted from a thread)."""
    k8s = conf.kubernetes
    return events.EventPoster(
        lambda: apiclient.make_api_client(api_root=k8s.api_root, kubeconfig=k8s.kubeconfig,
                                          token_file=k8s.token_file, ca_file=k8s.ca_file),
        conf.cni_daemon.node_name)


class CNIWorker(cotyledon.Service):
    """One of ``worker_count`` pre-forked workers.

    ``run`` serves until ``terminate``; ``terminate`` stops accepting at once and
    waits for requests in flight (bounded by the request timeout) before the
    process exits 0. An exception in ``run`` ends the process with status 1
    and cotyledon starts a replacement. Worker 0 also runs the
    :mod:`~kuryr_cni.daemon.housekeeping` thread.
    """

    name = 'cni-worker'

    def __init__(self, worker_id, conf, registry, sockets):
        super().__init__(worker_id)
        self.conf = conf
        self.registry = registry
        self.sockets = sockets
        self.servers = []
        self.housekeeper = None

    def run(self):
        setproctitle.setproctitle(TITLE)
        app = api.CNIApp(build_ownership(self.conf, self.registry,
                                         events=build_event_poster(self.conf)),
                         self.registry, self.conf.cni_daemon.request_timeout)
        inspect = api.InspectApp(self.registry, version.VERSION)
        self.servers = [server.BoundedServer(sock, api.CNIHandler,
                                             self.conf.cni_daemon.worker_concurrency,
                                             app=app, inspect=inspect,
                                             read_deadline=self.conf.cni_daemon.client_timeout)
                        for sock in self.sockets]
        if self.worker_id == 0:
            self.housekeeper = housekeeping.Housekeeper(
                app.ownership, state.DelQueue(self.conf.cni_daemon.state_dir)).start()
        for extra in self.servers[1:]:     # the optional TCP listener
            threading.Thread(target=extra.serve_forever, daemon=True).start()
        beat = heartbeat.Heartbeat(self.registry.status, self.name, self.worker_id,
                                   self.conf.health.heartbeat_timeout)
        self.servers[0].serve_forever(tick=beat.beat, tick_interval=beat.interval)

    def terminate(self):
        if self.housekeeper is not None:
            self.housekeeper.stop()
        for srv in self.servers:
            if not srv.stop(drain_timeout=self.conf.cni_daemon.request_timeout):
                LOG.warning('Exiting with %d requests still in flight', srv.active)
        if self.housekeeper is not None:
            self.housekeeper.join(timeout=self.conf.cni_daemon.request_timeout)
