"""What operators expect of an OpenStack node service: options and logging.

Every option the daemon registers is listed through the ``oslo.config.opts``
entry point (so oslo-config-generator and the docs' configuration reference
see them all), and the daemon speaks only through oslo.log: no print, no
stdlib logger, no logging configuration of its own.
"""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kuryr_cni import conf as config

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / 'kuryr_cni'
# Command-line tools that talk to a person, and the test bed: not the daemon.
NOT_THE_DAEMON = {'ctl.py', 'demo.py', 'testbed'}
# oslo.config's own command-line options, registered by every ConfigOpts.
OSLO_CONFIG_BUILTINS = {'config_file', 'config_dir', 'config_source', 'shell_completion'}


def _entry_point(name):
    found = [ep for ep in importlib.metadata.entry_points(group='oslo.config.opts')
             if ep.name == name]
    assert len(found) == 1, 'entry point %s: %s' % (name, found)
    return found[0]


def test_the_entry_point_is_list_opts():
    assert _entry_point('kuryr_cni').value == 'kuryr_cni.conf:list_opts'
    assert _entry_point('kuryr_cni').load() is config.list_opts


def test_every_registered_option_is_listed():
    conf = config.load([])
    listed = {group: {opt.dest for opt in opts} for group, opts in config.list_opts()}
    for group, names in listed.items():
        assert set(conf[group]) == names, group
    groups = set(listed)
    oslo_log = {opt.dest for _, opts in _entry_point('oslo.log').load()() for opt in opts}
    top_level = {name for name in conf if name not in groups} - OSLO_CONFIG_BUILTINS
    assert top_level and top_level <= oslo_log, top_level - oslo_log


def test_every_option_has_help():
    for group, opts in config.list_opts():
        for opt in opts:
            assert opt.help and opt.help.strip().endswith('.'), '%s.%s' % (group, opt.name)


def test_the_generator_finds_every_option_through_the_entry_point(tmp_path):
    out = tmp_path / 'sample.conf'
    generator = os.path.join(os.path.dirname(sys.executable), 'oslo-config-generator')
    if not os.path.exists(generator):
        pytest.skip('oslo-config-generator is not installed beside %s' % sys.executable)
    subprocess.run([generator, '--namespace', 'kuryr_cni', '--output-file', str(out)],
                   check=True, timeout=60, cwd=str(REPO))
    sections = {}
    current = None
    for line in out.read_text().splitlines():
        if line.startswith('['):
            current = line.strip('[]')
        elif current and re.match(r'#\w+ =( |$)', line):    # '#name =' when empty
            sections.setdefault(current, set()).add(line[1:].split(' =')[0])
    assert sections == {group: {opt.dest for opt in opts}
                        for group, opts in config.list_opts()}


def _daemon_modules():
    for path in sorted(PACKAGE.rglob('*.py')):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] not in NOT_THE_DAEMON:
            yield relative, ast.parse(path.read_text(), str(path))


LOGGING_CONFIG = {'basicConfig', 'dictConfig', 'fileConfig', 'addHandler', 'setLevel'}
# What runs before oslo.log can be set up, because its configuration is what
# failed: the one line of a configuration error goes to stderr.
BEFORE_LOGGING = {('conf.py', '_parse'), (os.path.join('daemon', 'main.py'), 'main')}


def _before_logging_lines(path, tree):
    return {line for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and (str(path), node.name) in BEFORE_LOGGING
            for line in range(node.lineno, node.end_lineno + 1)}


def _violations(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == 'print':
                yield node.lineno, 'print()'
            if isinstance(func, ast.Attribute) and func.attr in LOGGING_CONFIG:
                yield node.lineno, '.%s()' % func.attr
            if (isinstance(func, ast.Attribute) and func.attr == 'write'
                    and isinstance(func.value, ast.Attribute)
                    and func.value.attr in ('stdout', 'stderr')):
                yield node.lineno, 'sys.%s.write()' % func.value.attr
        elif isinstance(node, ast.Import):
            if any(alias.name.split('.')[0] == 'logging' for alias in node.names):
                yield node.lineno, 'import logging (use "from oslo_log import log as logging")'
        elif isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 'logging':
            yield node.lineno, 'from logging import ...'


def test_the_daemon_speaks_only_through_oslo_log():
    found = ['%s:%d: %s' % (path, line, what)
             for path, tree in _daemon_modules() for line, what in _violations(tree)
             if line not in _before_logging_lines(path, tree)]
    assert found == []


def test_the_checker_catches_what_it_forbids():
    code = ('import logging\nfrom logging import handlers\nprint(1)\n'
            'logging.basicConfig()\nLOG.logger.addHandler(h)\nsys.stderr.write("x")\n')
    assert [line for line, _ in _violations(ast.parse(code))] == [1, 2, 3, 4, 5, 6]
