"""A breadth-first explorer of :mod:`tests.model.protocol`: every reachable state, once.

Why not a tool: TLA+'s TLC is not in Debian or PyPI (``tlaplus-cli`` downloads it
at run time, which CI cannot), and the realcode state machine imports the
model's names, which wants the model in Python. PyPI's explicit-state checkers
for Python (``minicheck``, ``musil``) are months old, one author each; what
this needs (a visited set, parent links for the shortest counterexample, a
check at each state, each step and each quiescent end) is the loop below.

Breadth first, so the first violation found has a shortest trace.
"""

import collections
import dataclasses
import time

from tests.model import protocol


@dataclasses.dataclass
class Result:
    states: int
    transitions: int
    quiescent: int          # states where the runtime is done, each healed and checked
    seconds: float
    violation: str = None
    trace: list = None      # the actions from the initial state to the violation

    def report(self, bounds):
        pods = ', '.join('%s (port %s, sandboxes %s)' % (p.name, p.port, len(p.incarnations))
                         for p in bounds.pods)
        text = ('%s: %d states, %d transitions, %d quiescent ends, %.1f s; pods %s; '
                '%d DELs per sandbox, %d disruptions, %d kernel refusals, %d GCs'
                % (bounds.variant, self.states, self.transitions, self.quiescent,
                   self.seconds, pods, bounds.dels_per_sandbox, bounds.disruptions,
                   bounds.refusals, bounds.gcs))
        if self.violation:
            text += '\nVIOLATION: %s\n%s' % (self.violation, '\n'.join(
                '  %2d. %s' % (i + 1, action) for i, action in enumerate(self.trace)))
        return text


def explore(bounds, limit=None, want=None):
    """Explore every state reachable under ``bounds``; stop at the first violation
    (``want``: the first whose description contains each of these words; others are
    passed over)."""
    model = protocol.Model(bounds)
    started = time.monotonic()
    first = model.initial()
    parent = {first: None}          # state -> (previous state, action)
    frontier = collections.deque([first])
    transitions = quiescent = 0
    healed_from = {}                # state -> where healing it ends

    def found(st, why, tail=()):
        if want and not all(word in why for word in want):
            return None
        trace = []
        while parent[st] is not None:
            st, action = parent[st]
            trace.append(action)
        return Result(len(parent), transitions, quiescent, time.monotonic() - started,
                      why, trace[::-1] + list(tail))

    while frontier:
        st = frontier.popleft()
        problem = protocol.check_state(model, st)
        if problem and found(st, problem):
            return found(st, problem)
        steps = model.successors(st)
        if protocol.runtime_done(st):
            quiescent += 1
            try:
                healed, _ = protocol.heal(model, st, healed_from)
                problem = protocol.check_quiescent(model, healed)
            except AssertionError as exc:
                problem = str(exc)
            if problem and found(st, problem):
                healing = protocol.heal(model, st)[1] if 'healing steps' not in problem else []
                return found(st, problem, ['(healing) ' + a for a in healing])
        for action, nxt, worker in steps:
            transitions += 1
            problem = protocol.check_step(model, st, nxt, worker)
            if problem and found(st, problem, [action]):
                return found(st, problem, [action])
            if nxt not in parent:
                parent[nxt] = (st, action)
                frontier.append(nxt)
        if limit and len(parent) > limit:
            raise RuntimeError('more than %d states' % limit)
    return Result(len(parent), transitions, quiescent, time.monotonic() - started)
