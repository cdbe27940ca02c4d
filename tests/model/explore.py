"""A breadth-first explorer of :mod:`tests.model.protocol`: every reachable state, once.

Why not a tool: TLA+'s TLC (Java, which the machine has) is in neither Debian nor
PyPI nor the Maven mirror here (``org.lamport:tla2tools`` is not served;
``tlaplus-cli`` downloads it at run time, which CI cannot); SPIN is in Debian,
but its model would be Promela, a second copy of the protocol beside the one the
real-code state machine imports its names from (``STEPS``, ``DURABLE_STEPS``).
PyPI's explicit-state checkers for Python (``minicheck`` 0.4, ``musil`` 0.36)
are months old, one author each; what this needs (a visited set of
fingerprints, parent links for the shortest counterexample, a check at each
state, each step and each quiescent end, a symmetry) is the loop below.

Breadth first, so the first violation found has a shortest trace.

Compact, so that millions of states fit: a visited state is kept as its 64-bit
fingerprint only (:func:`fingerprint`), and its parent as an index into the
array of fingerprints in the order they were found. Only the frontier holds
whole states. A counterexample's trace is rebuilt by replaying the chain of
fingerprints from the initial state: at each step, the successor whose
fingerprint is the next one. Two distinct states with one fingerprint would
hide the second (and what only it leads to): for n states and a uniform 64-bit
hash the chance that any two of them collide is at most n²/2⁶⁵ (4·10⁻⁷ for
four million, 4·10⁻⁶ for the 12.7 million of the largest bound); see
:func:`fingerprint` for why the hash is taken as uniform, and
``test_fingerprints_lose_no_state`` for a check.
"""

import array
import collections
import dataclasses
import resource
import time

from tests.model import protocol


def fingerprint(model, st):
    """The 64-bit fingerprint of ``st`` up to the model's symmetry.

    ``hash()`` of the canonical state: CPython hashes a tuple with xxHash's
    round over its items' hashes, a frozenset by mixing its items' hashes
    (order-free, so equal sets agree however they were built), and a string
    with SipHash-1-3 under a key drawn at random for each process. Every state
    holds sandbox names, so every fingerprint passes through the keyed hash;
    and a collision in one run is not one in the next (a fresh key), so it
    cannot hide a state for good.
    """
    return hash(model.canonical(st))


@dataclasses.dataclass
class Result:
    states: int
    transitions: int
    quiescent: int          # states where the runtime is done, each healed and checked
    seconds: float          # wall clock
    cpu_seconds: float      # this process's CPU time: the measure on a shared machine
    violation: str = None
    trace: list = None      # the actions from the initial state to the violation
    peak_rss_mb: int = 0    # the process's peak resident memory so far (ru_maxrss)
    widest: int = 0         # the largest frontier: the states held whole at once

    def report(self, bounds):
        pods = ', '.join('%s (port %s, sandboxes %s)' % (p.name, p.port, len(p.incarnations))
                         for p in bounds.pods)
        text = ('%s: %d states, %d transitions, %d quiescent ends, %.1f s (CPU %.1f s), '
                'peak RSS %d MB (widest frontier %d); pods %s; %d DELs per sandbox, '
                '%d disruptions, %d kernel refusals, %d GCs%s'
                % (bounds.variant, self.states, self.transitions, self.quiescent,
                   self.seconds, self.cpu_seconds, self.peak_rss_mb, self.widest, pods,
                   bounds.dels_per_sandbox, bounds.disruptions, bounds.refusals, bounds.gcs,
                   '; without %s' % ', '.join(sorted(bounds.without)) if bounds.without
                   else ''))
        if self.violation:
            text += '\nVIOLATION: %s\n%s' % (self.violation, '\n'.join(
                '  %2d. %s' % (i + 1, action) for i, action in enumerate(self.trace)))
        return text


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


class _Explorer:

    def __init__(self, bounds, limit, want, progress):
        self.model = protocol.Model(bounds)
        self.limit, self.want, self.progress = limit, want, progress
        self.seen = set()                   # fingerprints of the states found
        self.order = array.array('q')       # the same, in the order found
        self.parent = array.array('l')      # the index in ``order`` of each one's parent
        self.settled = set()                # fingerprints of states whose healing ends clean
        self.transitions = self.quiescent = self.widest = 0
        self.started, self.cpu_started = time.monotonic(), time.process_time()

    def key(self, st):
        return fingerprint(self.model, st)

    def run(self):
        first = self.model.initial()
        self.add(self.key(first), -1)
        frontier = collections.deque([(0, first)])
        while frontier:
            self.widest = max(self.widest, len(frontier))
            index, st = frontier.popleft()
            problem = self.wanted(protocol.check_state(self.model, st))
            if problem:
                return self.result(index, _CheckState())
            steps = self.model.successors(st)
            if protocol.runtime_done(st):
                self.quiescent += 1
                if self.wanted(self.settle(st)):
                    return self.result(index, _CheckHealed())
            for action, nxt, worker in steps:
                self.transitions += 1
                if self.wanted(protocol.check_step(self.model, st, nxt, worker)):
                    return self.result(index, _CheckStep(action))
                fp = self.key(nxt)
                if fp not in self.seen:
                    frontier.append((self.add(fp, index), nxt))
            if self.progress and index % 500000 == 0:
                self.progress(self.result(None, None))
            if self.limit and len(self.order) > self.limit:
                raise RuntimeError('more than %d states' % self.limit)
        return self.result(None, None)

    def add(self, fp, parent):
        self.seen.add(fp)
        self.order.append(fp)
        self.parent.append(parent)
        return len(self.order) - 1

    def wanted(self, problem):
        if problem and self.want and not all(word in problem for word in self.want):
            return None
        return problem

    def settle(self, st):
        """Heal ``st`` (:func:`protocol.heal`'s schedule) and check its end; the states
        passed on the way that end clean are remembered, and not healed again."""
        st = protocol.healing(st)
        passed = []
        for _ in range(protocol.HEAL_LIMIT):
            fp = self.key(st)
            if fp in self.settled:
                problem = None
                break
            passed.append(fp)
            steps = self.model.successors(st, healing=True)
            if not steps:
                problem = protocol.check_quiescent(self.model, st)
                break
            st = steps[0][1]
        else:
            problem = 'no quiescence after %d healing steps' % protocol.HEAL_LIMIT
        if not problem:
            self.settled.update(passed)
        return problem

    def result(self, index, check):
        result = Result(len(self.order), self.transitions, self.quiescent,
                        time.monotonic() - self.started,
                        time.process_time() - self.cpu_started, peak_rss_mb=_peak_rss_mb(),
                        widest=self.widest)
        if index is not None:
            st, trace = self.replay(index)
            result.violation, tail = check.again(self, st)
            result.trace = trace + tail
        return result

    def replay(self, index):
        """The actions from the initial state to the one found at ``index``, and the state
        they end in (that one, or a symmetric one: a renaming of its pods)."""
        chain = []
        while index > 0:
            chain.append(self.order[index])
            index = self.parent[index]
        st, trace = self.model.initial(), []
        for fp in reversed(chain):
            action, st = next((action, nxt) for action, nxt, _w in self.model.successors(st)
                              if self.key(nxt) == fp)
            trace.append(action)
        return st, trace


# What was found wrong at a state, found again on the replayed state (whose names may be
# a renaming of the stored one's): the violation's text, and the actions after the state.

class _CheckState:
    @staticmethod
    def again(explorer, st):
        return protocol.check_state(explorer.model, st), []


class _CheckStep:
    def __init__(self, action):
        self.action = action

    def again(self, explorer, st):
        for action, nxt, worker in explorer.model.successors(st):
            problem = explorer.wanted(protocol.check_step(explorer.model, st, nxt, worker))
            if problem:
                return problem, [action]
        raise AssertionError('the replay lost the step %s' % self.action)


class _CheckHealed:
    @staticmethod
    def again(explorer, st):
        try:
            healed, healing = protocol.heal(explorer.model, st)
        except AssertionError as exc:
            return str(exc), []
        return (protocol.check_quiescent(explorer.model, healed),
                ['(healing) ' + action for action in healing])


def explore(bounds, limit=None, want=None, progress=None):
    """Explore every state reachable under ``bounds``; stop at the first violation
    (``want``: the first whose description contains each of these words; others are
    passed over). ``progress``: called with the figures so far every 500,000 states."""
    return _Explorer(bounds, limit, want, progress).run()
