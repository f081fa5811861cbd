"""Acme's own adder test cases, run through apexrl's adders into tables of a real ReplayServer on 127.0.0.1.

The step sequences and expected items below are transcribed from google-deepmind/acme
(https://github.com/google-deepmind/acme): ``acme/adders/reverb/test_cases.py`` (17 transition cases, 13 sequence
cases) and ``acme/adders/reverb/episode_test.py`` (12 episode cases), under this notice:

    Copyright 2018 DeepMind Technologies Limited. All rights reserved.

    Licensed under the Apache License, Version 2.0 (the "License");
    you may not use this file except in compliance with the License.
    You may obtain a copy of the License at

        http://www.apache.org/licenses/LICENSE-2.0

    Unless required by applicable law or agreed to in writing, software
    distributed under the License is distributed on an "AS IS" BASIS,
    WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
    See the License for the specific language governing permissions and
    limitations under the License.

Only the data is Acme's (dm_env's ``restart``/``transition``/``termination``/``truncation`` are spelled here as
small tuples, without dm_env); the harness is ours. Each case runs into a fresh FIFO table (a sample of every item
returns them oldest first), and every item is compared field by field (numpy's almost-equal, 6 decimals, as Acme's
``run_test_adder``).

How an Acme time step becomes an ``add``: ``discount=`` the step's discount; a LAST step whose discount is all
zeros is ``terminated``, another LAST step ``truncated``. Extras are passed where the case has them.

Deliberate differences, each a documented option or convention of the adders (apexrl.replay.adders):

- n-step discount: Acme stores ``g^(m-1) * d_0 ... d_(m-1)``, apexrl ``g^m * d_0 ... d_(m-1)`` (gamma folded in
  once more, so the learner's target is ``R + D * Q`` with no gamma of its own); the expected discounts are
  multiplied by ``g`` here (the ``additional_discount``); with ``g = 1`` they are Acme's values as they are.
- start of an episode: Acme also writes the ``min(n, T) - 1`` shorter transitions ``s_0 -> s_1 ... s_0 ->
  s_(n-1)``; apexrl's default (Ape-X's) does not. The cases run with ``shorter_at_start=True`` (Acme's items, all
  of them) and with the default (Acme's items without those, checked to be exactly the first ``min(n, T) - 1``).
- sequences and episodes store ``start_of_episode`` only with ``start_of_episode=True`` (set here) and ``extras``
  per step only with ``extras_per="step"`` (Acme's sequence cases have none).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

from apexrl.replay import (
    EpisodeAdder,
    NStepTransitionAdder,
    ReplayClient,
    ReplayServer,
    SequenceAdder,
    ServerConfig,
    TableConfig,
)
from apexrl.replay.adders import VecNStepTransitionAdder


class TimeStep(NamedTuple):
    last: bool
    reward: Any
    discount: Any
    observation: Any


def restart(observation: Any) -> Any:
    return observation


def transition(reward: Any, observation: Any, discount: Any = 1.0) -> TimeStep:
    return TimeStep(False, reward, discount, observation)


def termination(reward: Any, observation: Any, discount: Any = 0.0) -> TimeStep:
    return TimeStep(True, reward, discount, observation)


def truncation(reward: Any, observation: Any, discount: Any = 1.0) -> TimeStep:
    return TimeStep(True, reward, discount, observation)


class T(NamedTuple):  # acme.types.Transition
    observation: Any
    action: Any
    reward: Any
    discount: Any
    next_observation: Any
    extras: Any = ()


A = np.array

# fmt: off
TRANSITION_CASES = [
    dict(name="OneStepFinalReward", n=1, g=1.0, first=restart(1),
         steps=((0, transition(0.0, 2)), (0, transition(0.0, 3)), (0, termination(1.0, 4))),
         expected=(T(1, 0, 0.0, 1.0, 2), T(2, 0, 0.0, 1.0, 3), T(3, 0, 1.0, 0.0, 4))),
    dict(name="OneStepDict", n=1, g=1.0, first=restart({"foo": 1}),
         steps=((0, transition(0.0, {"foo": 2})), (0, transition(0.0, {"foo": 3})), (0, termination(1.0, {"foo": 4}))),
         expected=(T({"foo": 1}, 0, 0.0, 1.0, {"foo": 2}), T({"foo": 2}, 0, 0.0, 1.0, {"foo": 3}),
                   T({"foo": 3}, 0, 1.0, 0.0, {"foo": 4}))),
    dict(name="OneStepExtras", n=1, g=1.0, first=restart(1),
         steps=((0, transition(0.0, 2), {"state": 0}), (0, transition(0.0, 3), {"state": 1}),
                (0, termination(1.0, 4), {"state": 2})),
         expected=(T(1, 0, 0.0, 1.0, 2, {"state": 0}), T(2, 0, 0.0, 1.0, 3, {"state": 1}),
                   T(3, 0, 1.0, 0.0, 4, {"state": 2}))),
    dict(name="OneStepExtrasZeroes", n=1, g=1.0, first=restart(1),
         steps=((0, transition(0.0, 2), np.zeros(1)), (0, transition(0.0, 3), np.zeros(1)),
                (0, termination(1.0, 4), np.zeros(1))),
         expected=(T(1, 0, 0.0, 1.0, 2, np.zeros(1)), T(2, 0, 0.0, 1.0, 3, np.zeros(1)),
                   T(3, 0, 1.0, 0.0, 4, np.zeros(1)))),
    dict(name="TwoStep", n=2, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2, 0.5)), (0, transition(1.0, 3, 0.5)), (0, termination(1.0, 4))),
         expected=(T(1, 0, 1.0, 0.50, 2), T(1, 0, 1.5, 0.25, 3), T(2, 0, 1.5, 0.00, 4), T(3, 0, 1.0, 0.00, 4))),
    dict(name="TwoStepStructuredReward", n=2, g=1.0, first=restart(1),
         steps=((0, transition((1.0, 2.0), 2, 0.5)), (0, transition((1.0, 2.0), 3, 0.5)),
                (0, termination((1.0, 2.0), 4))),
         expected=(T(1, 0, (1.0, 2.0), (0.50, 0.50), 2), T(1, 0, (1.5, 3.0), (0.25, 0.25), 3),
                   T(2, 0, (1.5, 3.0), (0.00, 0.00), 4), T(3, 0, (1.0, 2.0), (0.00, 0.00), 4))),
    dict(name="TwoStepNDArrayReward", n=2, g=1.0, first=restart(1),
         steps=((0, transition(A((1.0, 2.0)), 2, 0.5)), (0, transition(A((1.0, 2.0)), 3, 0.5)),
                (0, termination(A((1.0, 2.0)), 4))),
         expected=(T(1, 0, A((1.0, 2.0)), A((0.50, 0.50)), 2), T(1, 0, A((1.5, 3.0)), A((0.25, 0.25)), 3),
                   T(2, 0, A((1.5, 3.0)), A((0.00, 0.00)), 4), T(3, 0, A((1.0, 2.0)), A((0.00, 0.00)), 4))),
    dict(name="TwoStepStructuredDiscount", n=2, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2, {"a": 0.5, "b": 0.1})), (0, transition(1.0, 3, {"a": 0.5, "b": 0.1})),
                (0, termination(1.0, 4, {"a": 0.0, "b": 0.0}))),
         expected=(T(1, 0, {"a": 1.0, "b": 1.0}, {"a": 0.50, "b": 0.10}, 2),
                   T(1, 0, {"a": 1.5, "b": 1.1}, {"a": 0.25, "b": 0.01}, 3),
                   T(2, 0, {"a": 1.5, "b": 1.1}, {"a": 0.00, "b": 0.00}, 4),
                   T(3, 0, {"a": 1.0, "b": 1.0}, {"a": 0.00, "b": 0.00}, 4))),
    dict(name="TwoStepNDArrayDiscount", n=2, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2, A((0.5, 0.1)))), (0, transition(1.0, 3, A((0.5, 0.1)))),
                (0, termination(1.0, 4, A((0.0, 0.0))))),
         expected=(T(1, 0, A((1.0, 1.0)), A((0.50, 0.10)), 2), T(1, 0, A((1.5, 1.1)), A((0.25, 0.01)), 3),
                   T(2, 0, A((1.5, 1.1)), A((0.00, 0.00)), 4), T(3, 0, A((1.0, 1.0)), A((0.00, 0.00)), 4))),
    dict(name="TwoStepBroadcastedNDArrays", n=2, g=1.0, first=restart(1),
         steps=((0, transition(A([[1.0, 2.0]]), 2, A([[0.5], [0.1]]))),
                (0, transition(A([[1.0, 2.0]]), 3, A([[0.5], [0.1]]))),
                (0, termination(A([[1.0, 2.0]]), 4, A([[0.0], [0.0]])))),
         expected=(T(1, 0, A([[1.0, 2.0], [1.0, 2.0]]), A([[0.50], [0.10]]), 2),
                   T(1, 0, A([[1.5, 3.0], [1.1, 2.2]]), A([[0.25], [0.01]]), 3),
                   T(2, 0, A([[1.5, 3.0], [1.1, 2.2]]), A([[0.00], [0.00]]), 4),
                   T(3, 0, A([[1.0, 2.0], [1.0, 2.0]]), A([[0.00], [0.00]]), 4))),
    dict(name="TwoStepStructuredBroadcastedNDArrays", n=2, g=1.0, first=restart(1),
         steps=((0, transition({"a": A([[1.0, 2.0]])}, 2, A([[0.5], [0.1]]))),
                (0, transition({"a": A([[1.0, 2.0]])}, 3, A([[0.5], [0.1]]))),
                (0, termination({"a": A([[1.0, 2.0]])}, 4, A([[0.0], [0.0]])))),
         expected=(T(1, 0, {"a": A([[1.0, 2.0], [1.0, 2.0]])}, {"a": A([[0.50], [0.10]])}, 2),
                   T(1, 0, {"a": A([[1.5, 3.0], [1.1, 2.2]])}, {"a": A([[0.25], [0.01]])}, 3),
                   T(2, 0, {"a": A([[1.5, 3.0], [1.1, 2.2]])}, {"a": A([[0.00], [0.00]])}, 4),
                   T(3, 0, {"a": A([[1.0, 2.0], [1.0, 2.0]])}, {"a": A([[0.00], [0.00]])}, 4))),
    dict(name="TwoStepWithExtras", n=2, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2, 0.5), {"state": 0}), (0, transition(1.0, 3, 0.5), {"state": 1}),
                (0, termination(1.0, 4), {"state": 2})),
         expected=(T(1, 0, 1.0, 0.50, 2, {"state": 0}), T(1, 0, 1.5, 0.25, 3, {"state": 0}),
                   T(2, 0, 1.5, 0.00, 4, {"state": 1}), T(3, 0, 1.0, 0.00, 4, {"state": 2}))),
    dict(name="ThreeStepDiscounted", n=3, g=0.4, first=restart(1),
         steps=((0, transition(1.0, 2, 0.5)), (0, transition(1.0, 3, 0.5)), (0, termination(1.0, 4))),
         expected=(T(1, 0, 1.00, 0.5, 2), T(1, 0, 1.20, 0.1, 3), T(1, 0, 1.24, 0.0, 4), T(2, 0, 1.20, 0.0, 4),
                   T(3, 0, 1.00, 0.0, 4))),
    dict(name="ThreeStepVaryingReward", n=3, g=0.5, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, termination(7.0, 5))),
         expected=(T(1, 0, 2, 1.00, 2), T(1, 0, 2 + 0.5 * 3, 0.50, 3), T(1, 0, 2 + 0.5 * 3 + 0.25 * 5, 0.25, 4),
                   T(2, 0, 3 + 0.5 * 5 + 0.25 * 7, 0.00, 5), T(3, 0, 5 + 0.5 * 7, 0.00, 5), T(4, 0, 7, 0.00, 5))),
    dict(name="SingleTransitionEpisode", n=4, g=1.0, first=restart(1),
         steps=((0, termination(1.0, 2)),),
         expected=(T(1, 0, 1.00, 0.0, 2),)),
    dict(name="EpisodeShorterThanN", n=4, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2)), (0, termination(1.0, 3))),
         expected=(T(1, 0, 1.00, 1.0, 2), T(1, 0, 2.00, 0.0, 3), T(2, 0, 1.00, 0.0, 3))),
    dict(name="EpisodeEqualToN", n=3, g=1.0, first=restart(1),
         steps=((0, transition(1.0, 2)), (0, termination(1.0, 3))),
         expected=(T(1, 0, 1.00, 1.0, 2), T(1, 0, 2.00, 0.0, 3), T(2, 0, 1.00, 0.0, 3))),
]

# (observation, action, reward, discount, start_of_episode, extras)
_F = False
SEQUENCE_CASES = [
    dict(name="PeriodOne", length=3, period=1, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, termination(7.0, 5))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 0.0, _F, ())],
                   [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 0.0, _F, ()), (5, 0, 0.0, 0.0, _F, ())]),
         end="zero_pad"),
    dict(name="PeriodTwo", length=3, period=2, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, termination(7.0, 5))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 0.0, _F, ()), (5, 0, 0.0, 0.0, _F, ())]),
         end="zero_pad"),
    dict(name="EarlyTerminationPeriodOne", length=3, period=1, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, termination(3.0, 3))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 0.0, _F, ()), (3, 0, 0.0, 0.0, _F, ())],),
         end="zero_pad"),
    dict(name="EarlyTerminationPeriodTwo", length=3, period=2, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, termination(3.0, 3))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 0.0, _F, ()), (3, 0, 0.0, 0.0, _F, ())],),
         end="zero_pad"),
    dict(name="EarlyTerminationPaddingPeriodOne", length=4, period=1, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, termination(3.0, 3))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 0.0, _F, ()), (3, 0, 0.0, 0.0, _F, ()),
                    (0, 0, 0.0, 0.0, _F, ())],),
         end="zero_pad"),
    dict(name="EarlyTerminationPaddingPeriodTwo", length=4, period=2, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, termination(3.0, 3))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 0.0, _F, ()), (3, 0, 0.0, 0.0, _F, ()),
                    (0, 0, 0.0, 0.0, _F, ())],),
         end="zero_pad"),
    dict(name="EarlyTerminationNoPadding", length=4, period=1, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, termination(3.0, 3))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 0.0, _F, ()), (3, 0, 0.0, 0.0, _F, ())],),
         end="truncate"),
    dict(name="LongEpisodePadding", length=3, period=3, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, transition(7.0, 5)),
                (0, transition(9.0, 6)), (0, transition(11.0, 7)), (0, termination(13.0, 8))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ()), (6, 0, 11.0, 1.0, _F, ())],
                   [(7, 0, 13.0, 0.0, _F, ()), (8, 0, 0.0, 0.0, _F, ()), (0, 0, 0.0, 0.0, _F, ())]),
         end="zero_pad"),
    dict(name="LongEpisodeNoPadding", length=3, period=3, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, transition(7.0, 5)),
                (0, transition(9.0, 6)), (0, transition(11.0, 7)), (0, termination(13.0, 8))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ()), (6, 0, 11.0, 1.0, _F, ())],
                   [(7, 0, 13.0, 0.0, _F, ()), (8, 0, 0.0, 0.0, _F, ())]),
         end="truncate"),
    dict(name="EndBehavior_WRITE", length=3, period=2, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, transition(7.0, 5)),
                (0, termination(8.0, 6))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 1.0, _F, ()), (5, 0, 8.0, 0.0, _F, ())],
                   [(4, 0, 7.0, 1.0, _F, ()), (5, 0, 8.0, 0.0, _F, ()), (6, 0, 0.0, 0.0, _F, ())]),
         end="write"),
    dict(name="NonBreakingSequenceOnEpisodeReset", length=3, period=2, first=restart(1),
         steps=((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, transition(7.0, 5)),
                (0, transition(9.0, 6)), (0, transition(11.0, 7)), (0, termination(13.0, 8))),
         expected=([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
                   [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ())],
                   [(5, 0, 9.0, 1.0, _F, ()), (6, 0, 11.0, 1.0, _F, ()), (7, 0, 13.0, 0.0, _F, ())]),
         end="continue", repeat=1),
]
_SIX = ((0, transition(2.0, 2)), (0, transition(3.0, 3)), (0, transition(5.0, 4)), (0, transition(7.0, 5)),
        (0, transition(9.0, 6)))


def _repeated(last_discount: float) -> tuple:
    d = last_discount
    return ([(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
            [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ())],
            [(5, 0, 9.0, 1.0, _F, ()), (6, 0, 13.0, d, _F, ()), (7, 0, 0.0, 0.0, _F, ())],
            [(7, 0, 0.0, 0.0, _F, ()), (1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ())],
            [(2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 1.0, _F, ())],
            [(4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ()), (6, 0, 13.0, d, _F, ())],
            [(6, 0, 13.0, d, _F, ()), (7, 0, 0.0, 0.0, _F, ()), (1, 0, 2.0, 1.0, True, ())],
            [(1, 0, 2.0, 1.0, True, ()), (2, 0, 3.0, 1.0, _F, ()), (3, 0, 5.0, 1.0, _F, ())],
            [(3, 0, 5.0, 1.0, _F, ()), (4, 0, 7.0, 1.0, _F, ()), (5, 0, 9.0, 1.0, _F, ())],
            [(5, 0, 9.0, 1.0, _F, ()), (6, 0, 13.0, d, _F, ()), (7, 0, 0.0, 0.0, _F, ())])


SEQUENCE_CASES += [
    dict(name="NonBreakingSequenceMultipleTerminatedEpisodes", length=3, period=2, first=restart(1),
         steps=(*_SIX, (0, termination(13.0, 7))), expected=_repeated(0.0), end="continue", repeat=3),
    dict(name="NonBreakingSequenceMultipleTruncatedEpisodes", length=3, period=2, first=restart(1),
         steps=(*_SIX, (0, truncation(13.0, 7))), expected=_repeated(1.0), end="continue", repeat=3),
]
# fmt: on


def make_trajectory(observations: list[int]) -> tuple[Any, list]:
    """Acme's test_utils.make_trajectory."""
    middle = [(0, transition(0.0, o)) for o in observations[1:-1]]
    return restart(observations[0]), [*middle, (0, termination(0.0, observations[-1]))]


def make_sequence(observations: list[int]) -> list[tuple]:
    """Acme's test_utils.make_sequence."""
    first, steps = make_trajectory(observations)
    observation, sequence, start = first, [], True
    for action, ts in steps:
        sequence.append((observation, action, ts.reward, ts.discount, start, ()))
        observation, start = ts.observation, False
    sequence.append((observation, 0, 0.0, 0.0, False, ()))
    return sequence


EPISODE_LENGTHS = (2, 10, 50)
EPISODE_PADDING = ((2, 1), (10, 2), (50, 5))

# --------------------------------------------------------------------------------------------- the harness

_names = iter(range(1000))


@pytest.fixture(scope="module")
def server():
    tables = [TableConfig(f"q{i}", sampler="fifo", capacity=1000) for i in range(160)]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with ReplayClient(server.endpoint, timeout=30) as c:
        yield c


def _table() -> str:
    return f"q{next(_names)}"


def _all_zero(tree: Any) -> bool:
    if isinstance(tree, dict):
        return all(_all_zero(v) for v in tree.values())
    return bool(np.all(np.asarray(tree) == 0))


def play(adder: Any, first: Any, steps: Any, repeat: int = 1) -> None:
    """Acme's run_test_adder loop through apexrl's call order."""
    for _ in range(repeat):
        adder.add_first(first)
        for step in steps:
            action, ts = step[0], step[1]
            extras = step[2] if len(step) == 3 else None
            terminated = ts.last and _all_zero(ts.discount)
            adder.add(
                action, ts.reward, ts.observation, terminated, ts.last and not terminated, extras, discount=ts.discount
            )


def assert_same(expected: Any, got: Any, what: str) -> None:
    """Field by field: mappings key by key, leaves with numpy's almost-equal (6 decimals, as Acme's harness)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), f"{what}: keys {got!r} != {expected!r}"
        for k in expected:
            assert_same(expected[k], got[k], f"{what}/{k}")
        return
    np.testing.assert_array_almost_equal(np.asarray(got), np.asarray(expected), decimal=6, err_msg=what)


def scale(tree: Any, g: float) -> Any:
    if isinstance(tree, dict):
        return {k: scale(v, g) for k, v in tree.items()}
    return g * np.asarray(tree, np.float64)


def sample_all(client: ReplayClient, table: str) -> Any:
    size = client.tables()[table]["size"]
    return None if size == 0 else client.sample(size, table=table)


def rows(tree: Any, n: int) -> list[Any]:
    def row(t: Any, i: int) -> Any:
        return {k: row(v, i) for k, v in t.items()} if isinstance(t, dict) else t[i]

    return [row(tree, i) for i in range(n)]


def check_transitions(client: ReplayClient, table: str, expected: list[T], g: float) -> None:
    assert client.tables()[table]["size"] == len(expected)
    batch = client.sample(len(expected), table=table)  # FIFO: every item once, oldest first
    for i, (want, got) in enumerate(zip(expected, rows(batch.fields, len(expected)), strict=True)):
        assert_same(want.observation, got["obs"], f"item {i} observation")
        assert_same(want.action, got["action"], f"item {i} action")
        assert_same(want.reward, got["reward"], f"item {i} reward")
        assert_same(scale(want.discount, g), got["discount"], f"item {i} discount (Acme's times g)")
        assert_same(want.next_observation, got["next_obs"], f"item {i} next_observation")
        if isinstance(want.extras, tuple) and want.extras == ():
            assert "extras" not in got
        else:
            assert_same(want.extras, got["extras"], f"item {i} extras")


def _shorter(case: dict) -> int:
    """How many of Acme's items are its shorter start-of-episode transitions: min(n, T) - 1, the first ones."""
    return min(case["n"], len(case["steps"])) - 1


def _lead(tree: Any) -> Any:
    """One environment's value as the rows of K = 1."""
    if isinstance(tree, dict):
        return {k: _lead(v) for k, v in tree.items()}
    return np.asarray(tree)[None]


class VecAsOne:
    """A VecNStepTransitionAdder of one environment driven through the single-environment call order."""

    def __init__(self, adder: VecNStepTransitionAdder):
        self.adder = adder

    def add_first(self, observation: Any) -> None:
        self.adder.add_first(_lead(observation))

    def add(self, action, reward, next_obs, terminated, truncated, extras=None, *, discount=None) -> None:
        self.adder.add(
            [action],
            _lead(reward),
            _lead(next_obs),
            [terminated],
            [truncated],
            extras=None if extras is None else _lead(extras),
            discounts=_lead(discount),
        )


@pytest.mark.parametrize("adder_kind", ["nstep", "vectorised"])
@pytest.mark.parametrize("shorter_at_start", [True, False], ids=["acme_start", "apex_start"])
@pytest.mark.parametrize("case", TRANSITION_CASES, ids=[c["name"] for c in TRANSITION_CASES])
def test_transition_cases(client, case, shorter_at_start, adder_kind):
    table = _table()
    if adder_kind == "nstep":
        adder: Any = NStepTransitionAdder(
            client, table, case["n"], case["g"], insert_batch=1, shorter_at_start=shorter_at_start
        )
    else:
        vec = VecNStepTransitionAdder(
            client, table, case["n"], case["g"], 1, insert_batch=1, shorter_at_start=shorter_at_start
        )
        adder = VecAsOne(vec)
    play(adder, case["first"], case["steps"])
    (vec if adder_kind == "vectorised" else adder).close()
    expected = list(case["expected"])
    if not shorter_at_start:
        # Ape-X's start (the default): Acme's items without its shorter start-of-episode ones, which are the
        # first min(n, T) - 1 items, all from s_0.
        k = _shorter(case)
        assert all(t.observation == case["first"] for t in expected[:k])
        expected = expected[k:]
    check_transitions(client, table, expected, case["g"])


def check_sequences(client: ReplayClient, table: str, expected: list[list[tuple]], length: int) -> None:
    assert client.tables()[table]["size"] == len(expected)
    batch = client.sample(len(expected), table=table)
    for i, want in enumerate(expected):
        assert batch.mask[i].tolist() == [True] * len(want) + [False] * (batch.mask.shape[1] - len(want)), i
        f = batch.fields
        for j, (obs, action, reward, discount, start, extras) in enumerate(want):
            where = f"sequence {i} step {j}"
            assert_same(obs, f["obs"][i, j], f"{where} observation")
            assert_same(action, f["action"][i, j], f"{where} action")
            assert_same(reward, f["reward"][i, j], f"{where} reward")
            assert_same(discount, f["discount"][i, j], f"{where} discount")
            assert bool(f["start_of_episode"][i, j]) is start, f"{where} start_of_episode"
            assert extras == () and "extras" not in f


@pytest.mark.parametrize("case", SEQUENCE_CASES, ids=[c["name"] for c in SEQUENCE_CASES])
def test_sequence_cases(client, case):
    table = _table()
    adder = SequenceAdder(
        client, table, case["length"], case["period"], end_of_episode_behavior=case["end"], start_of_episode=True
    )
    play(adder, case["first"], case["steps"], case.get("repeat", 1))
    adder.flush(timeout=30)
    adder.close()
    check_sequences(client, table, list(case["expected"]), case["length"])


@pytest.mark.parametrize("max_sequence_length", EPISODE_LENGTHS)
def test_episode_adder(client, max_sequence_length):
    table = _table()
    adder = EpisodeAdder(client, table, max_sequence_length, start_of_episode=True)
    observations = list(range(max_sequence_length))
    play(adder, *make_trajectory(observations))
    adder.flush(timeout=30)
    adder.close()
    check_sequences(client, table, [make_sequence(observations)], max_sequence_length)


@pytest.mark.parametrize("max_sequence_length", EPISODE_LENGTHS)
def test_episode_max_sequence_length(client, max_sequence_length):
    table = _table()
    adder = EpisodeAdder(client, table, max_sequence_length, start_of_episode=True)
    first, steps = make_trajectory(list(range(max_sequence_length + 1)))
    adder.add_first(first)
    for action, ts in steps[:-1]:
        adder.add(action, ts.reward, ts.observation, False, False, discount=ts.discount)
    adder.flush(timeout=30)
    assert client.tables()[table]["size"] == 0
    action, ts = steps[-1]
    with pytest.raises(ValueError, match="max_sequence_length"):
        adder.add(action, ts.reward, ts.observation, True, False, discount=ts.discount)
    adder.flush(timeout=30)
    assert client.tables()[table]["size"] == 0  # the refused step changed nothing
    adder.close()


@pytest.mark.parametrize("fill", [0, -1], ids=["padding", "nonzero_padding"])
@pytest.mark.parametrize(("max_sequence_length", "padding"), EPISODE_PADDING)
def test_episode_padding(client, max_sequence_length, padding, fill):
    table = _table()
    fn = np.zeros if fill == 0 else (lambda s, d: np.zeros(s, d) - 1)
    adder = EpisodeAdder(client, table, max_sequence_length + padding, padding_fn=fn, start_of_episode=True)
    observations = list(range(max_sequence_length))
    play(adder, *make_trajectory(observations))
    adder.flush(timeout=30)
    adder.close()
    expected = make_sequence(observations) + [(fill, fill, float(fill), float(fill), False, ())] * padding
    check_sequences(client, table, [expected], max_sequence_length + padding)
