"""Every decoder of peer or file bytes, fuzzed with hypothesis on a small budget.

Each run draws a fresh seed, so CI explores new inputs every time instead of the
same 300 per target; the seed is printed at the end of the run and named in any
failure, and ``CHORUS_FUZZ_SEED=<seed> scripts/test tests/fuzz`` replays it.

The long runs (a million inputs and more per target) are ``scripts/fuzz``; see
``tests/fuzz/targets.py`` for the targets and what each may raise.
"""

from __future__ import annotations

import os
import random

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import Target, all_targets, check, mutate

#: Environment variable that fixes the run's seed (to replay a failure).
SEED_VARIABLE = "CHORUS_FUZZ_SEED"
#: This run's seed: the variable's value, else drawn fresh.
SEED = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(2**32))
REPLAY = f"{SEED_VARIABLE}={SEED} scripts/test tests/fuzz"

TARGETS = {t.name: t for t in all_targets()}

#: Targets with a known untyped failure, run as strict xfails until fixed (none now).
KNOWN_OPEN: dict[str, str] = {}

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


NAMES = [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_OPEN[n]))
    if n in KNOWN_OPEN
    else n
    for n in sorted(TARGETS)
]


def _assert_typed(target: Target, data: bytes) -> None:
    bad = check(target, data)
    if bad is not None:
        raise AssertionError(
            f"{target.name}: {type(bad).__name__}: {bad!r} escaped for input {data[:200]!r}"
            f" (fuzz seed {SEED}; replay: {REPLAY})"
        ) from bad


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_are_accepted(name: str) -> None:
    target = TARGETS[name]
    for seed in target.seeds:
        target.run(seed)  # the corpus is valid input: mutations start from real formats


@pytest.mark.parametrize("name", NAMES)
@hypothesis.seed(SEED)
@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_raise_only_the_typed_error(name: str, data: bytes) -> None:
    _assert_typed(TARGETS[name], data)


@pytest.mark.parametrize("name", NAMES)
@hypothesis.seed(SEED)
@FUZZ
@given(mutation=st.integers(0, 2**32 - 1))
def test_mutated_seeds_raise_only_the_typed_error(name: str, mutation: int) -> None:
    target = TARGETS[name]
    _assert_typed(target, mutate(target.seeds, random.Random(mutation)))


def test_a_non_utf8_config_is_one_config_error() -> None:
    """The measured failure (issue 17.4): a config file that is not UTF-8."""
    _assert_typed(TARGETS["store_config"], b'[ingest]\nchannels = ["\xff\xfe"]\n')
