"""The parameter service: the learner serves its policy weights (safetensors bytes) to the actors.

:mod:`.service` (ParamServer, ParamClient, ParamPoller, the tensors' wire form) and :mod:`.tensors` (safetensors,
tensor specs and their mismatches).
"""
