"""Ingresses: the wire shapes that feed the one receiver chain (seed §5).

Each ingress decodes its frames into a :class:`crosstalk.core.message.Message` whose
:class:`~crosstalk.core.message.Sender` the *transport* proved, and hands it to
:meth:`crosstalk.receiver.Receiver.receive`. Policy lives in the receiver, never here.
"""

from crosstalk.ingress.socket_files import IngressError
from crosstalk.ingress.uds import UdsIngress

__all__ = ["IngressError", "UdsIngress"]
