"""The watcher process: keeps the registry's pod table in step with the API server."""

import threading

import cotyledon
import setproctitle

from kuryr_cni import apiclient
from kuryr_cni import metrics
from kuryr_cni import watcher

TITLE = 'kuryr-cni-daemon: watcher'


class WatcherService(cotyledon.Service):
    """Runs :class:`kuryr_cni.watcher.PodWatcher` until terminated.

    ``terminate`` stops the loop at its next wait (a watch read times out within
    the request timeout). The watcher never raises out of its loop; if the
    process dies anyway, cotyledon starts a new one, which relists.
    """

    name = 'watcher'

    def __init__(self, worker_id, conf, registry):
        super().__init__(worker_id)
        self.conf = conf
        self.registry = registry
        self.stop_event = threading.Event()

    def run(self):
        setproctitle.setproctitle(TITLE)
        k8s = self.conf.kubernetes
        client = apiclient.make_api_client(api_root=k8s.api_root, kubeconfig=k8s.kubeconfig,
                                           token_file=k8s.token_file, ca_file=k8s.ca_file)
        watcher.PodWatcher(client, self.conf.cni_daemon.node_name, self.registry,
                           watch_timeout=k8s.watch_timeout,
                           on_restart=metrics.watch_restarted,
                           on_event=metrics.watch_event).run(self.stop_event)

    def terminate(self):
        self.stop_event.set()
        self.registry.mark_synced(False)
