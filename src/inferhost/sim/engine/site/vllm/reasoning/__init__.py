"""The stand-in vLLM's reasoning parser registry: the real release's names, recorded."""

import standin_engine


class ReasoningParserManager:
    @classmethod
    def list_registered(cls):
        return standin_engine.parser_names("reasoning")

    @classmethod
    def import_reasoning_parser(cls, plugin_path):
        standin_engine.load_parser_plugin("reasoning", plugin_path)

    @classmethod
    def get_reasoning_parser(cls, name):
        return standin_engine.vllm_get_reasoning_parser(name)
