"""conftest.py's lane machinery: the fast lane's guard (--unmarked-limit), on a tiny inner test
run, and the node ids that keep `--dist loadgroup`'s groups."""
from __future__ import annotations

import re

import conftest

pytest_plugins = ['pytester']

INNER = '''
import time

import pytest


@pytest.fixture
def slow_setup():
  time.sleep(0.15)


def test_unmarked_slow_call():
  time.sleep(0.25)


def test_unmarked_slow_setup_and_call(slow_setup):
  time.sleep(0.15)


@pytest.mark.slow
def test_marked_slow():
  time.sleep(0.25)


@pytest.mark.parametrize('n', [pytest.param(1, marks=pytest.mark.cli)])
def test_marked_case(n):
  time.sleep(0.25)


def test_quick():
  pass


def test_failing_stays_failed():
  time.sleep(0.25)
  assert False, 'its own failure'
'''


def _run(pytester, *args):
  pytester.makeini('[pytest]\nmarkers =\n' + ''.join(
      f'    {m}: m\n' for m in conftest.INTEGRATION_MARKERS))
  pytester.makepyfile(test_inner=INNER)
  return pytester.inline_run('-p', 'no:cacheprovider', '-p', 'no:xdist', *args,
                             plugins=[conftest])


def test_unmarked_test_over_the_limit_fails_naming_its_duration_limit_and_markers(pytester):
  """Each sleep is under the limit; setup + call of the second test is over it."""
  passed, _, failed = _run(pytester, '--unmarked-limit=0.2').listoutcomes()
  assert sorted(r.nodeid.split('::')[-1] for r in passed) == [
      'test_marked_case[1]', 'test_marked_slow', 'test_quick']
  why = {r.nodeid.split('::')[-1]: r.longreprtext for r in failed}
  assert sorted(why) == ['test_failing_stays_failed', 'test_unmarked_slow_call',
                         'test_unmarked_slow_setup_and_call']
  assert re.fullmatch(
      r'test_inner.py::test_unmarked_slow_setup_and_call took \d+\.\d\d s \(setup \d+\.\d\d s, '
      r'call \d+\.\d\d s\), over --unmarked-limit=0.2 s for a test carrying none of the '
      r'markers cli, multiprocess, docs, tpu_compile, bench, slow: mark it with its kind \(or '
      r'slow\), or make it faster\.', why['test_unmarked_slow_setup_and_call'])
  assert 'its own failure' in why['test_failing_stays_failed']


def test_without_the_option_nothing_is_timed(pytester):
  reprec = _run(pytester, '-k', 'unmarked_slow_call')
  reprec.assertoutcome(passed=1)


def test_a_group_xdist_named_reaches_the_node_id(pytester):
  """What pytest-xdist's worker does for `--dist loadgroup` (sets `_nodeid` to 'ID@GROUP'), the
  node id then says, so its scheduler keeps the group on one worker."""
  items = pytester.getitems('def test_a(): pass\ndef test_b(): pass\n')
  plain = items[1].nodeid
  items[0]._nodeid = f'{items[0].nodeid}@g'  # pylint: disable=protected-access
  conftest.pytest_collection_modifyitems(items)
  assert [item.nodeid for item in items] == ['test_a_group_xdist_named_reaches_the_node_id.py::'
                                             'test_a@g', plain]
