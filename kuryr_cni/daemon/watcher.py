"""The watcher process: keeps the registry's pod table in step with the API server."""

import contextlib
import threading

import cotyledon
import setproctitle

from kuryr_cni import apiclient
from kuryr_cni import listwatch
from kuryr_cni import metrics
from kuryr_cni.daemon import heartbeat
from kuryr_cni.daemon import health
from kuryr_cni.vifsource import annotation
from kuryr_cni.vifsource import kuryrport

TITLE = 'kuryr-cni-daemon: watcher'


class WatcherService(cotyledon.Service):
    """Runs the VIF source of ``[cni_daemon] vif_source`` until terminated.

    ``annotation``: one list+watch of this node's pods
    (:class:`kuryr_cni.vifsource.annotation.PodAnnotations`). ``kuryrport``:
    one of this node's KuryrPorts and, in a second thread, one of its pods,
    merged by :class:`kuryr_cni.vifsource.kuryrport.PodVIFs`.

    ``terminate`` waits for the CNI workers to drain (their ADDs may wait for
    VIFs), then stops the loops, cutting their open watch streams. The
    list+watch never raises out of its loop; if the process dies anyway,
    cotyledon starts a new one, which relists.
    """

    name = 'watcher'

    def __init__(self, worker_id, conf, registry):
        super().__init__(worker_id)
        self.conf = conf
        self.registry = registry
        self.stop_event = threading.Event()
        # Built in the new process before it drops root (kuryr_cni.daemon.main):
        # the token, CA and client certificate files may be root's alone.
        self.client = apiclient.from_options(conf.kubernetes)

    def run(self):
        setproctitle.setproctitle(TITLE)
        # From a thread: the watch loop itself may block on a quiet stream for
        # up to watch_timeout plus the read timeout, which is not being stuck.
        heartbeat.Heartbeat(self.registry.status, self.name, self.worker_id,
                            self.conf.health.heartbeat_timeout).run_in_thread(self.stop_event)
        k8s = self.conf.kubernetes
        client = self.client
        node = self.conf.cni_daemon.node_name
        options = dict(watch_timeout=k8s.watch_timeout, on_restart=metrics.watch_restarted,
                       on_event=metrics.watch_event, on_skip=metrics.watch_object_skipped,
                       on_activity=self.registry.status.note_watch_activity,
                       awaited=self.registry.bindings.awaits_unseen_pod,
                       list_max_bytes=k8s.list_max_bytes, list_timeout=k8s.list_timeout)
        if self.conf.cni_daemon.vif_source != 'kuryrport':
            source = annotation.PodAnnotations(client, node)
            self._list_watch(source, self.registry, options).run(self.stop_event)
            return
        # KuryrPorts carry the VIFs; the pods' own watch only tells deletions.
        merged = kuryrport.PodVIFs(self.registry)
        pods = self._list_watch(kuryrport.PodPresence(client, node), merged.pods, options)
        pod_thread = threading.Thread(target=pods.run, args=(self.stop_event,),
                                      name='pod-watch', daemon=True)
        pod_thread.start()
        self._list_watch(kuryrport.KuryrPorts(client, node), merged.ports,
                         options).run(self.stop_event)
        pod_thread.join()

    def _list_watch(self, source, sink, options):
        status = self.registry.status

        def on_limit(limit, problem):
            # Counted each time; /ready names it until the server keeps within limits.
            if limit is not None:
                metrics.watch_limit_exceeded(limit)
            status.note_api_limit(source.what, problem)

        return listwatch.ListWatch(source, sink, on_limit=on_limit, **options)

    def terminate(self):
        # ADDs in flight may still wait for their VIFs: feed them until the
        # CNI workers have drained (bounded like the workers' own drain).
        health.wait_for_cni_workers_to_exit(self.registry, self.conf.cni_daemon.request_timeout)
        self.stop_event.set()
        with contextlib.suppress(ConnectionError, EOFError, OSError):   # the Manager died
            self.registry.mark_synced(False)
