"""The CNI protocol as the daemon sees it: parsing requests, formatting results.

No I/O here: this package turns untrusted request bodies into validated
values, and plugged interfaces into results in the requested spec version.
"""

SUPPORTED_VERSIONS = ('0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0')
COMMANDS = ('ADD', 'DEL', 'CHECK', 'GC', 'STATUS')


def version_tuple(version):
    return tuple(int(part) for part in version.split('.'))
