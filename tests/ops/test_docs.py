"""The Sphinx documentation builds with warnings as errors and covers what operators need.

The build is what ``tox -e docs`` runs, into a temporary directory; it is
skipped when Sphinx is not installed (``pip install -r doc/requirements.txt``).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuryr_cni import conf as config
from kuryr_cni import metrics

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / 'doc' / 'source'
PAGES = ('index', 'architecture', 'ownership', 'install', 'configuration', 'migration',
         'operations', 'security', 'troubleshooting', 'benchmark', 'gate')


@pytest.fixture(scope='module')
def html(tmp_path_factory):
    pytest.importorskip('sphinx', reason='Sphinx is not installed (doc/requirements.txt)')
    out = tmp_path_factory.mktemp('docs')
    proc = subprocess.run([sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q',
                           '-b', 'html', '-d', str(out / 'doctrees'), str(SOURCE),
                           str(out / 'html')],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / 'html'


def test_every_page_is_built(html):
    for page in PAGES:
        assert (html / (page + '.html')).is_file(), page


def test_the_configuration_reference_is_generated_from_the_options(html):
    text = (html / 'configuration.html').read_text()
    for group, opts in config.list_opts():
        for opt in opts:
            assert re.search(r'\b%s\.%s\b' % (group, opt.dest), text) or (
                'id="%s.%s"' % (group, opt.dest) in text), '%s.%s' % (group, opt.dest)


def _rst(page):
    """The page's source, every run of white space made one space."""
    return ' '.join((SOURCE / (page + '.rst')).read_text().split())


def test_the_operations_page_lists_every_metric_and_alert():
    text = _rst('operations')
    names = [spec.name for spec in metrics.SPECS + metrics.SCRAPED]
    for name in names:
        assert '``%s``' % name in text, name
    with open(REPO / 'etc' / 'prometheus' / 'kuryr-cni-alerts.yaml') as f:
        alerts = [rule['alert'] for group in yaml.safe_load(f)['groups']
                  for rule in group['rules']]
    for alert in alerts:
        assert alert in text, alert


def test_the_health_semantics_are_documented_as_implemented():
    text = _rst('operations')
    for problem in ('registry unavailable', 'no CNI worker serving', 'watcher stuck or dead',
                    'watcher not synced with the API server', 'CNI socket saturated',
                    'shutting down'):
        assert '``%s``' % problem in text, problem
    assert 'heartbeat_timeout' in text and 'consecutive_failures' in text


def test_every_name_read_from_kuryr_kubernetes_is_documented():
    text = _rst('configuration')
    for group, opts in config.list_opts():
        for opt in opts:
            for old in opt.deprecated_opts:
                assert '``[%s] %s``' % (old.group or group, old.name) in text or (
                    '``%s``' % old.name in text), (old.group or group, old.name)


def test_the_migration_page_is_in_the_index(html):
    assert 'href="migration.html"' in (html / 'index.html').read_text()


def test_the_readme_links_resolve():
    readme = (REPO / 'README.md').read_text()
    for target in re.findall(r'\]\((doc/[^)#]+)', readme):
        assert (REPO / target).is_file(), target


# As when only doc/requirements.txt is installed: oslo.config's show-options
# finds no kuryr_cni entry point (stevedore lists entry points for it).
_BUILD_WITHOUT_THE_ENTRY_POINT = r"""
import sys
import stevedore.extension
from sphinx.cmd.build import main

listed = stevedore.extension.ExtensionManager.list_entry_points

def without_ours(self):
    return [ep for ep in listed(self) if ep.name != 'kuryr_cni']

stevedore.extension.ExtensionManager.list_entry_points = without_ours
sys.exit(main(sys.argv[1:]))
"""


def test_the_build_fails_loudly_when_the_option_reference_is_empty(tmp_path):
    pytest.importorskip('sphinx', reason='Sphinx is not installed (doc/requirements.txt)')
    proc = subprocess.run([sys.executable, '-c', _BUILD_WITHOUT_THE_ENTRY_POINT, '-q',
                           '-b', 'html', '-d', str(tmp_path / 'doctrees'), str(SOURCE),
                           str(tmp_path / 'html')],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO),
                          # Sphinx writes its crash report to a temporary file: keep it here.
                          env={**os.environ, 'TMPDIR': str(tmp_path)})
    assert proc.returncode != 0
    assert 'the configuration reference lacks' in proc.stderr
    assert 'install kuryr-cni too' in proc.stderr
