"""The ownership rules of DESIGN §3: which sandbox may touch a pod's network.

A pod binding (persisted per pod by :class:`kuryr_cni.state.BindingStore`)::

    {"pod": "ns/name", "owner": <container ID or null>, "uid": <owner's pod UID>,
     "sandboxes": {<container ID>: {"netns": path, "uid": ...,
                                    "attachments": {"<network>/<CNI_IFNAME>": {
                                        "state": "plugging" | "ready",
                                        "interfaces": [{"ifname", "vif", "default_route"}],
                                        "result": {...}}}}}}

Rules, all applied under the pod's flock (:mod:`kuryr_cni.podlock`):

* ADD(B) waits (unlocked) until the watcher shows the pod's incarnation, then
  records B as owner and persists that before anything is plugged; evicts every
  other sandbox's devices (by their records, which stay persisted until the
  devices are gone); waits (unlocked) for the VIFs; and, still owner, records
  the attachment as ``plugging``, plugs, and records it ``ready``.
* DEL(A) from the owner unplugs A and clears the binding. DEL(A) from anyone
  else touches nothing of the owner's: it removes only what is provably A's and
  is counted as a rejected stale DEL. An unknown A is a successful no-op.
  "No owner recorded" never matches everything.

This module decides; the drivers in :mod:`kuryr_cni.binding` touch the kernel.
"""

import time

from oslo_log import log as logging

from kuryr_cni import binding as drivers
from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import netns
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import base
from kuryr_cni.cni import result as cni_result

LOG = logging.getLogger(__name__)

PRIMARY_IFNAME = 'eth0'     # the annotation's key for the interface named by CNI_IFNAME
_POLL_FIRST = 0.005
_POLL_MAX = 0.1


class Ownership:
    def __init__(self, registry, store, locks, vif_timeout, host_netns=None):
        self.registry = registry
        self.store = store
        self.locks = locks
        self.vif_timeout = vif_timeout
        self.host_netns = host_netns

    # ADD ------------------------------------------------------------------

    def add(self, req, deadline):
        netns.check_netns(req.netns, host=self.host_netns)
        pod = req.pod
        self.registry.status.put('add:' + req.container_id, time.time())
        try:
            wait_until = min(deadline, time.monotonic() + self.vif_timeout)
            started = time.monotonic()
            self._wait(pod, wait_until, 'the pod', lambda record: True)
            with self.locks.hold(pod.key, deadline):
                binding = self._load(pod.key)
                self._claim(binding, req)
                self._evict_others(binding, req.container_id)
            vifs = self._wait(pod, wait_until, 'its VIFs to be active', _vifs_ready)
            metrics.vif_waited(time.monotonic() - started)
            with self.locks.hold(pod.key, deadline):
                binding = self._load(pod.key)
                if binding['owner'] != req.container_id:
                    raise errors.TryAgainLater(
                        'sandbox %s was replaced by %s while waiting for VIFs'
                        % (req.container_id, binding['owner']))
                return self._plug(binding, req, vifs)
        finally:
            self.registry.status.drop('add:' + req.container_id)

    def _wait(self, pod, deadline, what, ready):
        """Poll the registry until ``pod``'s record satisfies ``ready``.

        Polling (not a Manager Condition) because a worker killed while holding
        a Manager-side lock would wedge every waiter; a poll costs ~0.2 ms.
        """
        delay = _POLL_FIRST
        while True:
            record = self.registry.pods.get(pod.key)
            if record and (pod.uid is None or record['uid'] == pod.uid) \
                    and not record.get('deleting'):
                if record.get('error'):
                    raise errors.InvalidVIF('pod %s: %s' % (pod.key, record['error']))
                outcome = ready(record)
                if outcome:
                    return outcome
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.TryAgainLater('timed out waiting for %s of pod %s%s'
                                           % (what, pod.key, _uid_note(pod)))
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)

    def _claim(self, binding, req):
        cid = req.container_id
        sandbox = binding['sandboxes'].setdefault(
            cid, {'netns': req.netns, 'uid': req.pod.uid, 'attachments': {}})
        if binding['owner'] == cid and sandbox['netns'] == req.netns:
            return
        if binding['owner'] not in (None, cid):
            LOG.info('Pod %s: sandbox %s replaces %s', binding['pod'], cid, binding['owner'])
        sandbox['netns'] = req.netns
        binding.update(owner=cid, uid=req.pod.uid)
        self._save(binding)

    def _evict_others(self, binding, owner):
        for cid in [c for c in binding['sandboxes'] if c != owner]:
            self._unplug_sandbox(binding, cid)
            metrics.sandbox_evicted()
            LOG.info('Pod %s: evicted the devices of previous sandbox %s', binding['pod'], cid)

    def _plug(self, binding, req, vifs):
        sandbox = binding['sandboxes'][req.container_id]
        key = '%s/%s' % (req.network, req.ifname)
        interfaces = _interfaces(vifs, req.ifname)
        previous = sandbox['attachments'].get(key)
        if previous is None:
            self._refuse_taken_names(req, interfaces)
        else:
            self._unplug_interfaces(req.container_id, sandbox['netns'], [
                i for i in previous['interfaces']
                if i['ifname'] not in {n['ifname'] for n in interfaces}])
        attachment = {'state': 'plugging', 'interfaces': interfaces}
        sandbox['attachments'][key] = attachment
        self._save(binding)
        try:
            self._connect_all(req, interfaces)
        except Exception:
            del sandbox['attachments'][key]
            self._save(binding)
            raise
        plugged = [(i['ifname'], vif_model.VIF.from_dict(i['vif']), i['default_route'])
                   for i in interfaces]
        result = cni_result.build(req.cni_version, req.netns, plugged, req.prev_result)
        attachment.update(state='ready', result=result)
        self._save(binding)
        return result

    def _refuse_taken_names(self, req, interfaces):
        with netns.iproute(req.netns) as ipr:
            existing = {link.get('ifname') for link in ipr.get_links()}
        taken = existing & {i['ifname'] for i in interfaces}
        if taken:
            raise errors.InvalidEnvironment(
                'interface %s already exists in %s for another attachment'
                % (', '.join(sorted(taken)), req.netns))

    def _connect_all(self, req, interfaces):
        done = []
        try:
            for interface in interfaces:
                plug = _plug_of(req.container_id, req.netns, interface)
                vif = vif_model.VIF.from_dict(interface['vif'])
                done.append((interface, plug))
                drivers.get_driver(vif.kind, self.host_netns).connect(vif, plug)
        except Exception:
            for interface, plug in reversed(done):
                self._disconnect(interface, plug)
            raise

    # DEL ------------------------------------------------------------------

    def delete(self, req, deadline):
        """Apply DEL; returns the outcome counted: success, noop or stale."""
        if req.netns and netns.exists(req.netns):   # a DEL may come after the netns is gone
            netns.check_netns(req.netns, host=self.host_netns)
        pod_key = req.pod.key if req.pod else self._find_container(req.container_id)
        if pod_key is None:
            self._remove_tagged(req)
            return 'noop'
        with self.locks.hold(pod_key, deadline) as remove_lock:
            binding = self.store.load(pod_key)
            if binding is None:
                self._remove_tagged(req)
                remove_lock()
                return 'noop'
            outcome = self._judge_delete(binding, req)
            if not binding['sandboxes']:
                self._forget(binding, remove_lock)
            return outcome

    def _judge_delete(self, binding, req):
        cid = req.container_id
        sandbox = binding['sandboxes'].get(cid)
        if binding['owner'] == cid:
            self._unplug_attachment(binding, cid, '%s/%s' % (req.network, req.ifname))
            if not sandbox['attachments']:
                binding.update(owner=None)
                for other in list(binding['sandboxes']):
                    self._unplug_sandbox(binding, other)
            self._save(binding)
            return 'success'
        if binding['owner'] is None:
            if sandbox is None:
                self._remove_tagged(req)
                return 'noop'
            self._unplug_sandbox(binding, cid)
            return 'success'
        reason = _stale_reason(binding, req)
        LOG.warning('Rejected stale DEL of pod %s from sandbox %s: owner is %s (%s)',
                    binding['pod'], cid, binding['owner'], reason)
        if sandbox is not None:
            self._unplug_sandbox(binding, cid)    # an earlier eviction that did not finish
        else:
            self._remove_tagged(req)
        metrics.stale_del_rejected(reason)
        self.registry.stale_dels.record({
            'time': time.time(), 'pod': binding['pod'], 'container_id': cid,
            'ifname': req.ifname, 'owner': binding['owner'], 'reason': reason})
        return 'stale'

    def _find_container(self, container_id):
        key = self.registry.bindings.find_container(container_id)
        if key is None:
            # The mirror lags the files only if a worker died between the two
            # writes; DELs without pod identity are rare, so scan the files.
            for binding in self.store.load_all().values():
                if container_id in binding['sandboxes']:
                    return binding['pod']
        return key

    def _remove_tagged(self, req):
        """Remove host devices provably of ``req``'s sandbox: named and tagged for it."""
        if req.ifname:
            drivers.remove_tagged_host_device(req.container_id, req.ifname, self.host_netns)

    # CHECK ----------------------------------------------------------------

    def check(self, req, deadline):
        netns.check_netns(req.netns, host=self.host_netns)
        pod_key = req.pod.key if req.pod else self._find_container(req.container_id)
        if pod_key is None:
            raise errors.UnknownContainer('container %s has no attachment here' % req.container_id)
        with self.locks.hold(pod_key, deadline):
            attachment = self._owned_attachment(self.store.load(pod_key), req)
            for interface in attachment['interfaces']:
                vif = vif_model.VIF.from_dict(interface['vif'])
                plug = _plug_of(req.container_id, req.netns, interface)
                drivers.get_driver(vif.kind, self.host_netns).check(vif, plug)
            _compare_prev_result(req.prev_result, attachment['result'])

    def _owned_attachment(self, binding, req):
        if binding is None or binding['owner'] != req.container_id:
            raise errors.UnknownContainer('container %s does not own a pod network here'
                                          % req.container_id)
        sandbox = binding['sandboxes'][req.container_id]
        attachment = sandbox['attachments'].get('%s/%s' % (req.network, req.ifname))
        if attachment is None or attachment['state'] != 'ready':
            raise errors.UnknownContainer('no attachment %s/%s for container %s'
                                          % (req.network, req.ifname, req.container_id))
        if sandbox['netns'] != req.netns:
            raise errors.CheckFailed('attachment lives in %s, not %s'
                                     % (sandbox['netns'], req.netns))
        return attachment

    # GC -------------------------------------------------------------------

    def stale_attachments(self, network, valid, max_add_age):
        """Attachments of ``network`` absent from ``valid`` {(cid, ifname)}.

        An attachment whose ADD is in flight is never stale: ADD registers
        itself before it records anything, and a registration older than
        ``max_add_age`` seconds is one whose worker died.
        """
        in_flight = self._adds_in_flight(max_add_age)
        stale = []
        for binding in self.store.load_all().values():
            for cid, sandbox in binding['sandboxes'].items():
                if cid in in_flight:
                    continue
                for key in sandbox['attachments']:
                    net, _, ifname = key.partition('/')
                    if net == network and (cid, ifname) not in valid:
                        stale.append((binding['pod'], cid, ifname))
        return stale

    def _adds_in_flight(self, max_age):
        now = time.time()
        return {key[4:] for key, started in self.registry.status.snapshot().items()
                if key.startswith('add:') and now - started < max_age}

    # Shared steps ----------------------------------------------------------

    def _load(self, pod_key):
        binding = self.store.load(pod_key)
        if binding is None:
            binding = {'pod': pod_key, 'owner': None, 'uid': None, 'sandboxes': {}}
        return binding

    def _save(self, binding):
        self.store.save(binding['pod'], binding)
        self.registry.bindings.put(binding['pod'], binding)

    def _forget(self, binding, remove_lock):
        self.store.remove(binding['pod'])
        self.registry.bindings.drop(binding['pod'])
        remove_lock()

    def _unplug_attachment(self, binding, cid, key):
        sandbox = binding['sandboxes'][cid]
        attachment = sandbox['attachments'].get(key)
        if attachment is not None:
            self._unplug_interfaces(cid, sandbox['netns'], attachment['interfaces'])
            del sandbox['attachments'][key]
        if not sandbox['attachments'] and binding['owner'] != cid:
            del binding['sandboxes'][cid]

    def _unplug_sandbox(self, binding, cid):
        """Remove every device of sandbox ``cid``; drop its record only after."""
        sandbox = binding['sandboxes'][cid]
        for attachment in sandbox['attachments'].values():
            self._unplug_interfaces(cid, sandbox['netns'], attachment['interfaces'])
        del binding['sandboxes'][cid]
        self._save(binding)

    def _unplug_interfaces(self, cid, sandbox_netns, interfaces):
        for interface in interfaces:
            self._disconnect(interface, _plug_of(cid, sandbox_netns, interface))

    def _disconnect(self, interface, plug):
        kind = interface['vif']['kind']
        drivers.get_driver(kind, self.host_netns).disconnect(plug)


def _vifs_ready(record):
    vifs = record.get('vifs') or {}
    if PRIMARY_IFNAME in vifs and all(v['active'] for v in vifs.values()):
        return {name: vif_model.VIF.from_dict(v) for name, v in vifs.items()}
    return None


def _interfaces(vifs, cni_ifname):
    """Map the annotation's interfaces to names in the pod (eth0 → CNI_IFNAME)."""
    named = {(cni_ifname if name == PRIMARY_IFNAME else name): vif for name, vif in vifs.items()}
    if len(named) != len(vifs):
        raise errors.InvalidVIF('CNI_IFNAME %s collides with another VIF of the pod' % cni_ifname)
    default = next((n for n, v in named.items() if v.default), cni_ifname)
    return [{'ifname': name, 'vif': vif.to_dict(), 'default_route': name == default}
            for name, vif in sorted(named.items(), key=lambda item: item[0] != cni_ifname)]


def _plug_of(cid, sandbox_netns, interface):
    return base.Plug(cid, sandbox_netns or '', interface['ifname'], interface['default_route'])


def _stale_reason(binding, req):
    owner = binding['sandboxes'].get(binding['owner'], {})
    owner_uid = owner.get('uid') or binding.get('uid')
    if req.pod and req.pod.uid and owner_uid and req.pod.uid != owner_uid:
        return 'pod_uid_mismatch'
    return 'container_id_mismatch'


def _uid_note(pod):
    return ' (UID %s)' % pod.uid if pod.uid else ''


def _compare_prev_result(prev, recorded):
    """CHECK: what the runtime cached must match what ADD answered."""
    if not prev:
        return
    for field in ('interfaces', 'ips', 'routes'):
        expected = _comparable(prev.get(field) or [], field)
        actual = _comparable(recorded.get(field) or [], field)
        if expected and expected - actual:
            raise errors.CheckFailed('prevResult %s differ from the attachment' % field,
                                     '%s not in %s' % (sorted(expected - actual), sorted(actual)))


def _comparable(items, field):
    keys = {'interfaces': ('name', 'mac', 'sandbox'), 'ips': ('address', 'gateway'),
            'routes': ('dst', 'gw')}[field]
    return {tuple(str(item.get(k)) for k in keys) for item in items if isinstance(item, dict)}
