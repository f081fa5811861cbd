"""The replay service's wire: what both ends of a connection agree on.

:mod:`.schema` (the protocol as data: kinds, frames, fields, limits, statuses), :mod:`.protocol` (the one
encoder and decoder it drives), :mod:`.roles` (which ops each client role may send), :mod:`.transport` (the one
request/reply loop, also the parameter client's), :mod:`.codec` (TransitionSpec: transitions <-> items) and
:mod:`.frames` (Atari frame stacks stored once). Never imports torch, nor the client or server side.
"""
