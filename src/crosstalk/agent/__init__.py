"""One registered agent (:class:`Agent`): its locks, journal, receiver, ingresses, descriptor.

- :mod:`crosstalk.agent.core` — :class:`Agent` and its start/stop order;
- :mod:`crosstalk.agent.lane` — the one ordered dispatch lane (both ingresses) and ask clock;
- :mod:`crosstalk.agent.taskgroup` — the one task group all the agent's background work runs in;
- :mod:`crosstalk.agent.claims` — this agent as a claim's target (seed §7);
- :mod:`crosstalk.agent.replies` — the staged reply (seed R4-R8);
- :mod:`crosstalk.agent.outbound` — what the agent sends: A2A messages, claims, native informs.
"""

from crosstalk.agent.claims import CROSSTALK_SENDER
from crosstalk.agent.core import Agent, AgentSpec
from crosstalk.agent.replies import ReplyRefused

__all__ = [
    "CROSSTALK_SENDER",
    "Agent",
    "AgentSpec",
    "ReplyRefused",
]
