"""The stand-in vLLM's tool-call parser registry: the real release's names, recorded."""

import standin_engine


class ToolParserManager(standin_engine.VllmParserManager):
    KIND = "tool"

    @classmethod
    def import_tool_parser(cls, plugin_path):
        cls.import_parser(plugin_path)
