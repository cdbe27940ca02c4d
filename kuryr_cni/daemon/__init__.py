"""The daemon: a cotyledon-managed parent with watcher, CNI worker and ops processes.

``main`` is the entry point; the other modules each hold one process's
service or one step of start-up. Nothing here touches the kernel directly:
that goes through :mod:`kuryr_cni.ownership` and the binding drivers.
"""
