"""The version of kuryr-cni: the daemon's, the package's and the shim's.

The one place it is written: setup.cfg reads it (``attr:``) and
tools/build-shim stamps it into the shim. Keep it a plain literal.
"""

VERSION = '0.2.0'
