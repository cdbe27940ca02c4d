"""The CNI worker process: serves the CNI API on the unix socket its parent opened."""

import cotyledon
import setproctitle
from oslo_log import log as logging

from kuryr_cni import adoption
from kuryr_cni import apiclient
from kuryr_cni import binding
from kuryr_cni import events
from kuryr_cni import kernel
from kuryr_cni import ownership
from kuryr_cni import podlock
from kuryr_cni import state
from kuryr_cni import version
from kuryr_cni.cni import request as cni_request
from kuryr_cni.daemon import api
from kuryr_cni.daemon import heartbeat
from kuryr_cni.daemon import housekeeping
from kuryr_cni.daemon import listener
from kuryr_cni.daemon import server

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: cni-worker'


def build_ownership(conf, registry, events=None):
    state_dir = conf.cni_daemon.state_dir
    port = kernel.Kernel(binding_options=binding.Options.from_conf(conf))
    return ownership.Ownership(
        registry=registry,
        store=state.BindingStore(state_dir),
        locks=podlock.PodLocks(state.ensure_dir(state_dir + '/locks')),
        kernel=port,
        vif_timeout=conf.cni_daemon.vif_timeout,
        events=events,
        adopter=adoption.Adopter(port, registry) if conf.binding.adopt else None,
        ready_signal=conf.cni_daemon.ready_signal)


def server_limits(opts):
    """The CNI server's bounds, from ``[cni_daemon]``."""
    return server.Limits(threads=opts.worker_concurrency, connections=opts.worker_connections,
                         head_timeout=min(opts.client_head_timeout, opts.client_timeout),
                         request_timeout=opts.client_timeout,
                         max_body=cni_request.MAX_BODY_BYTES)


def build_event_poster(conf):
    """Kubernetes Events about pods whose ADD waits for VIFs (posted from a thread).

    None with ``[kubernetes] use_events = false``: no Events.
    """
    if not conf.kubernetes.use_events:
        return None
    return events.EventPoster(lambda: apiclient.from_options(conf.kubernetes),
                              conf.cni_daemon.node_name, conf.cni_daemon.vif_source)


class CNIWorker(cotyledon.Service):
    """One of ``worker_count`` pre-forked workers.

    ``run`` serves until ``terminate``; ``terminate`` stops accepting at once and
    waits for requests in flight (bounded by the request timeout) before the
    process exits 0. An exception in ``run`` ends the process with status 1
    and cotyledon starts a replacement. Worker 0 also runs the
    :mod:`~kuryr_cni.daemon.housekeeping` thread.

    Every turn of the server's loop beats (:mod:`~kuryr_cni.daemon.heartbeat`)
    and tells the registry when the worker's connections reach their cap or
    have room again: readiness fails while every worker is at its cap.
    """

    name = 'cni-worker'

    def __init__(self, worker_id, conf, registry, sock):
        super().__init__(worker_id)
        self.conf = conf
        self.registry = registry
        self.sock = sock
        self.server = None
        self.housekeeper = None
        self._beat = None
        self._reported_saturation = False

    def run(self):
        setproctitle.setproctitle(TITLE)
        app = api.CNIApp(build_ownership(self.conf, self.registry,
                                         events=build_event_poster(self.conf)),
                         self.registry, self.conf.cni_daemon.request_timeout)
        inspect = api.InspectApp(self.registry, app.ownership.store, version.VERSION)
        handler = api.CNIHandler(app, inspect)
        self.server = server.BoundedServer(self.sock, handler, server_limits(self.conf.cni_daemon),
                                           'cni', admit=listener.refuse_non_root)
        if self.worker_id == 0:
            self.housekeeper = housekeeping.Housekeeper(
                app.ownership, state.DelQueue(self.conf.cni_daemon.state_dir)).start()
        self._beat = heartbeat.Heartbeat(self.registry.status, self.name, self.worker_id,
                                         self.conf.health.heartbeat_timeout)
        self.server.serve_forever(tick=self._tick, tick_interval=self._beat.interval)

    def _tick(self):
        """At the end of every turn of the server's loop: beat, and report saturation."""
        self._beat.beat()
        saturated = self.server.saturated
        if saturated != self._reported_saturation:
            self.registry.status.set_saturated(self.name, self.worker_id, saturated)
            self._reported_saturation = saturated

    def terminate(self):
        if self.housekeeper is not None:
            self.housekeeper.stop()
        if self.server is not None and not self.server.stop(
                drain_timeout=self.conf.cni_daemon.request_timeout):
            LOG.warning('Exiting with %d requests still in flight', self.server.active)
        if self.housekeeper is not None:
            self.housekeeper.join(timeout=self.conf.cni_daemon.request_timeout)
