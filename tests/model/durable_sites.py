"""Where the package makes durable filesystem calls, read from its source (issue 32 item 3).

The state machine and tests/model/paths.py crash a worker after each durable
call of :mod:`kuryr_cni.state` and :mod:`kuryr_cni.podlock` (the modules whose
``os`` and ``fcntl`` tests/model/crashpoints.py wraps). :func:`durable_api`
finds the functions of those two modules that make one (``open`` for writing,
``write``, ``fsync``, ``rename``, ``replace``, ``unlink``, ``remove``,
``flock``, directly or through another of them); :func:`call_sites` finds every
function of the rest of the package that calls one: the code paths performing
a durable step, each of which must be crashed at. Calls are resolved by name
and receiver (``self.store.save``, ``ownership.locks.hold``,
``state.write_atomically``, and a ``save`` handed in as a parameter, as
Ownership hands its ``_save`` to the adoption): an over-approximation is a
false alarm to look at, never a path missed.
"""

import ast
import os

import kuryr_cni

PACKAGE = os.path.dirname(kuryr_cni.__file__)
WRAPPED = ('state.py', 'podlock.py')
_DURABLE_OS = {'write', 'fsync', 'rename', 'replace', 'unlink', 'remove'}
_WRITE_FLAGS = ('O_CREAT', 'O_WRONLY', 'O_RDWR', 'O_TRUNC')
# Receivers whose methods of a durable name are the wrapped modules' objects.
_RECEIVERS = {'store', 'locks', 'queue', 'state', 'podlock', 'DelQueue', 'BindingStore',
              'PodLocks'}
# Reads whose one durable call sets an unreadable file aside (BindingStore._read,
# DelQueue.entries): no path of the model writes a corrupt file, so none is crashed
# there; tests/unit/test_state.py covers the setting aside.
READS = {'_read', 'load', 'load_all', 'entries'}
# A callable handed in that saves a binding (Ownership._save, to the adoption).
_SAVE_CALLBACKS = {'save', '_save'}


def _functions(tree, module):
    """(qualified name, node) of every function in ``tree``."""
    found = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append(('%s:%s' % (module, name), child))
                walk(child, name + '.<locals>.')
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + '.')
    walk(tree, '')
    return found


def _calls(node):
    """The calls made in a function's own body (not in functions nested in it)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(child, ast.Call):
            yield child
        yield from _calls(child)


def _dotted(expr):
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
    return list(reversed(parts))


def _parse(filename):
    with open(os.path.join(PACKAGE, filename), encoding='utf-8') as f:
        return ast.parse(f.read(), filename)


def durable_api():
    """Names of the functions and methods of the wrapped modules making a durable call."""
    functions = [f for name in WRAPPED
                 for f in _functions(_parse(name), name[:-3])]
    durable = set()
    changed = True
    while changed:
        changed = False
        for qualname, node in functions:
            short = qualname.rpartition(':')[2].rpartition('.')[2]
            if short in durable:
                continue
            for call in _calls(node):
                path = _dotted(call.func)
                if not path:
                    continue
                if path[0] == 'os' and path[-1] in _DURABLE_OS or path[-2:] == ['fcntl', 'flock'] \
                        or path[0] == 'os' and path[-1] == 'open' and any(
                            flag in ast.unparse(call) for flag in _WRITE_FLAGS) \
                        or path[-1] in durable and path[0] in ('self', 'cls', path[-1]):
                    durable.add(short)
                    changed = True
                    break
    return durable


def call_sites():
    """``module:function`` of every function outside the wrapped modules that calls one
    of :func:`durable_api`."""
    api = durable_api() - READS
    sites = set()
    for root, _dirs, files in os.walk(PACKAGE):
        for filename in sorted(files):
            rel = os.path.relpath(os.path.join(root, filename), PACKAGE)
            if not filename.endswith('.py') or rel in WRAPPED:
                continue
            module = 'kuryr_cni.' + rel[:-3].replace(os.sep, '.')
            for qualname, node in _functions(_parse(rel), module):
                for call in _calls(node):
                    path = _dotted(call.func)
                    if path and (path[-1] in api and len(path) > 1 and path[-2] in _RECEIVERS
                                 or path[-1] in _SAVE_CALLBACKS):
                        sites.add(qualname)
                        break
    return sites
