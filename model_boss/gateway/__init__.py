"""An inference gateway in front of model-boss (the Gateway API Inference Extension, llm-d):
what its endpoint picker reads here, in the names of its model server protocol."""

from .protocol import GatewayCollector, ModelLoad, protocol_families

__all__ = ["GatewayCollector", "ModelLoad", "protocol_families"]
