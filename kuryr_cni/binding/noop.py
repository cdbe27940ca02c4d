"""The smallest complete binding driver: the reference example for new ones.

It connects nothing, records nothing and touches no namespace; every call
succeeds. Use it where a VIF must be accepted without plugging anything (and
copy it when writing a driver: one class, a ``kind``, the three methods of
:class:`kuryr_cni.binding.base.Driver`, then one line in the registry of
:mod:`kuryr_cni.binding`).
"""

from kuryr_cni.binding import base


class NoopDriver(base.Driver):
    """Accepts every VIF and plugs nothing."""

    kind = 'noop'

    def connect(self, vif, plug):
        """Do nothing; never fails."""

    def disconnect(self, plug):
        """Do nothing; never fails (there is nothing to remove)."""

    def check(self, vif, plug):
        """Pass always: nothing was configured, so nothing can differ."""
