"""The stand-in vLLM's reasoning parser registry: the real release's names, recorded."""

import standin_engine


class ReasoningParserManager(standin_engine.VllmParserManager):
    KIND = "reasoning"

    @classmethod
    def import_reasoning_parser(cls, plugin_path):
        cls.import_parser(plugin_path)

    @classmethod
    def get_reasoning_parser(cls, name):
        return standin_engine.vllm_get_reasoning_parser(name)
