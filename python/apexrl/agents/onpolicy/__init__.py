"""What the on-policy agents (PPO, A2C, TRPO, IMPALA) share, each agent then one folder of its own:

- :mod:`~apexrl.agents.onpolicy.config`: :class:`OnPolicyConfig`, the settings of the data path and the networks.
- :mod:`~apexrl.agents.onpolicy.replay`: the replay path -- sequences with the behaviour policy's per-step
  extras into a queue table, popped once -- and the learner's batch of popped items.
- :mod:`~apexrl.agents.onpolicy.policy`: the actors' stochastic policy and the extras it hands out.
- :mod:`~apexrl.agents.onpolicy.nets`: Tonic's actor and critic MLPs.
- :mod:`~apexrl.agents.onpolicy.returns`: GAE and V-trace.
- :mod:`~apexrl.agents.onpolicy.lag`: the policy lag of a batch (metrics.csv's ``policy_lag_mean``/``_max``).
- :mod:`~apexrl.agents.onpolicy.learner`: the learner's shared half (advantages, critic, checkpoints).
- :mod:`~apexrl.agents.onpolicy.agentdef`: an on-policy agent's ``AgentDef``.
"""
