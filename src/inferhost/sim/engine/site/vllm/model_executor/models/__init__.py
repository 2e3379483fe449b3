"""The stand-in vLLM's model registry: the real release's architectures, recorded."""

import standin_engine


class ModelRegistry:
    @staticmethod
    def get_supported_archs():
        return standin_engine.architectures("vllm")
