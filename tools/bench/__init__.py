"""The benchmark: kuryr-cni against the reference CNI plugins, side by side in one run.

``python -m tools.bench`` (or ``tox -e bench``) builds two throwaway test hosts
(:mod:`tools.testbed.host`), one running the kuryr-cni daemon behind the
real shim, one for Debian's ``bridge`` + ``host-local`` plugins, drives both
with the same runtime-like driver (:mod:`tools.bench.driver`), interleaving the
two so that machine drift hits both alike, and writes a table, a JSON file and
a chart (:mod:`tools.bench.report`). See doc/source/benchmark.rst.

Modules: ``driver`` (exec like a runtime, inside a host namespace),
``systems`` (the two CNIs under test and their hosts), ``workload`` (the
measured phases), ``memory`` (PSS of the daemon's processes), ``stats``,
``report``, ``run`` (the whole run, in order) and ``__main__`` (the command line).
"""
