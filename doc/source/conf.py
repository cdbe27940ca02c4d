"""Sphinx configuration of the kuryr-cni documentation (``tox -e docs``)."""

import os
import sys

# The configuration reference imports kuryr_cni.conf through its entry point;
# from a plain checkout (no install) the package is found here.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..')))

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
