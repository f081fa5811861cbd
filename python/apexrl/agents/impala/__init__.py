"""IMPALA (Espeholt et al. 2018) on the on-policy queue path, as Acme's IMPALA: :mod:`~apexrl.agents.impala.config`,
:mod:`~apexrl.agents.impala.learner` (V-trace: :func:`apexrl.agents.onpolicy.returns.vtrace`) and
``--agent impala`` (:mod:`~apexrl.agents.impala.agent`)."""

from __future__ import annotations

from apexrl.agents.impala.config import IMPALA_FIELD_SOURCES, IMPALAConfig
from apexrl.agents.impala.learner import IMPALALearner

__all__ = ["IMPALAConfig", "IMPALALearner", "IMPALA_FIELD_SOURCES"]
