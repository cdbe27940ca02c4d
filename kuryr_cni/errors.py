"""CNI errors: one small hierarchy, each class carrying its CNI code.

Code raises these anywhere; they are turned into the CNI error JSON exactly
once, at the HTTP boundary (``kuryr_cni.daemon.api``). ``retry`` marks the
errors a runtime may cure by trying again (temporary versus permanent).
"""

import errno

# OSError numbers of a shortage of the daemon's (descriptors, memory): code 11,
# whatever call ran into it, never the request's fault nor an internal error.
SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


class CNIError(Exception):
    """Base of every error the runtime may see."""

    code = 999
    http_status = 500
    retry = False

    def __init__(self, msg, details=''):
        super().__init__(msg)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version):
        return {'cniVersion': cni_version, 'code': self.code,
                'msg': self.msg, 'details': self.details}


class IncompatibleVersion(CNIError):
    code, http_status = 1, 400


class UnsupportedField(CNIError):
    code, http_status = 2, 400


class UnknownContainer(CNIError):
    code, http_status = 3, 404


class InvalidEnvironment(CNIError):
    code, http_status = 4, 400


class IOFailure(CNIError):
    code, http_status = 5, 500


class DecodeFailure(CNIError):
    code, http_status = 6, 400


class InvalidConfig(CNIError):
    code, http_status = 7, 400


class TryAgainLater(CNIError):
    code, http_status, retry = 11, 503, True


class PluginNotAvailable(CNIError):
    code, http_status, retry = 50, 503, True


class LimitedConnectivity(CNIError):
    code, http_status, retry = 51, 503, True


class StateFailure(TryAgainLater):
    """The state dir refused a read or write (full, read-only, failing disk)."""


class UnreadableState(IOFailure):
    """A state file this release cannot read (written by a newer one); left untouched."""


class BodyTooLarge(CNIError):
    """The request body exceeds the daemon's limit (an input error)."""

    code, http_status = 4, 413


class InvalidVIF(CNIError):
    """A pod's VIF annotation or KuryrPort is malformed: operator error."""

    code, http_status = 7, 400


class CheckFailed(CNIError):
    """CHECK found the attachment differing from what was plugged.

    Plugin-specific codes start at 100 in the CNI specification.
    """

    code, http_status = 100, 409


class BindingFailed(CNIError):
    """The kernel refused to plug or unplug an interface."""

    code, http_status = 101, 500


class VIFNotAllowed(InvalidVIF):
    """A VIF the operator's binding policy refuses (``[binding] bridges``,
    ``parents``): refused before anything is changed."""


class AddressTaken(VIFNotAllowed):
    """A VIF's port, MAC or IP is bound to another live pod of the node (or, for a port,
    held by kuryr-daemon's devices proven another pod's VIF)."""
