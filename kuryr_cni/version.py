"""The package's version, as installed."""

from importlib import metadata

try:
    VERSION = metadata.version('kuryr-cni')
except metadata.PackageNotFoundError:      # running from a source tree
    VERSION = 'unknown'
