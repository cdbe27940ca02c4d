"""The one version of kuryr-cni: the daemon's, ``kuryr-cni-ctl``'s and the package's.

A literal, so that the build reads it without importing the package
(``pyproject.toml``: ``[tool.setuptools.dynamic]``).
"""

VERSION = '0.2.0'
