"""Sphinx configuration of the kuryr-cni documentation (``tox -e docs``)."""

import os
import sys

# The configuration reference imports kuryr_cni.conf through its entry point;
# from a plain checkout (no install) the package is found here.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..')))

from sphinx import addnodes  # noqa: E402
from sphinx.errors import ExtensionError  # noqa: E402

from kuryr_cni import conf as _kuryr_conf  # noqa: E402
from kuryr_cni import version as _version  # noqa: E402

project = 'kuryr-cni'
copyright = 'kuryr-cni authors'
author = 'kuryr-cni authors'
release = _version.VERSION
version = release

extensions = [
    'oslo_config.sphinxext',    # .. show-options:: for the configuration reference
]

root_doc = 'index'
exclude_patterns = []
# Warnings are errors in tox -e docs. Not nitpicky: the pages name Python
# modules with :mod: for readers, without an API reference to link them to.
highlight_language = 'none'
pygments_style = 'sphinx'

html_theme = 'alabaster'
html_title = 'kuryr-cni %s' % release
html_theme_options = {
    'description': 'A Kubernetes CNI node daemon that never lets a late DEL '
                   'disconnect a live pod.',
    'fixed_sidebar': True,
}
html_static_path = []


def _check_option_reference(app, doctree):
    """Fail the build unless configuration.rst shows every option of the daemon.

    ``.. show-options:: kuryr_cni`` finds the options through the package's
    ``oslo.config.opts`` entry point, which exists only once kuryr-cni is
    installed: from a checkout with doc/requirements.txt alone, the directive
    found nothing and the reference came out empty, without a warning.
    """
    if app.env.docname != 'configuration':
        return
    shown = {id_ for node in doctree.findall(addnodes.desc_signature) for id_ in node['ids']}
    missing = ['%s.%s' % (group, opt.dest) for group, opts in _kuryr_conf.list_opts()
               for opt in opts if '%s.%s' % (group, opt.dest) not in shown]
    if missing:
        raise ExtensionError(
            'the configuration reference lacks %d of the daemon\'s options (%s, ...): '
            'show-options finds them through the oslo.config.opts entry point of the '
            'installed package; install kuryr-cni too (pip install -e .), not only '
            'doc/requirements.txt' % (len(missing), ', '.join(missing[:3])))


def setup(app):
    app.connect('doctree-read', _check_option_reference)
