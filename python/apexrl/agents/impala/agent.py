"""``--agent impala``: the :class:`~apexrl.agents.base.AgentDef` that registers IMPALA (the behaviour policy's
log-probability per step is all V-trace needs of it: ``log rho = log pi - log mu``)."""

from __future__ import annotations

from apexrl.agents.impala.config import IMPALA_FIELD_SOURCES, IMPALAConfig
from apexrl.agents.impala.learner import IMPALALearner
from apexrl.agents.impala.presets import IMPALA_PRESETS
from apexrl.agents.onpolicy.agentdef import onpolicy_agent

__all__ = ["AGENT"]

AGENT = onpolicy_agent(
    "impala",
    "IMPALA: V-trace actor-critic on sequences popped once from a queue, actors acting on (Acme's defaults)",
    IMPALAConfig,
    IMPALALearner,
    presets=IMPALA_PRESETS,
    field_sources=IMPALA_FIELD_SOURCES,
)
