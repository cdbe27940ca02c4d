"""The one version of kuryr-cni: the daemon's, ``kuryr-cni-ctl``'s, the package's and the shim's.

A literal, so that the build reads it without importing the package
(``setup.cfg``: ``version = attr: kuryr_cni.version.VERSION``) and tools/build-shim
stamps it into the shim. Keep it a plain literal.
"""

VERSION = '0.2.0'
