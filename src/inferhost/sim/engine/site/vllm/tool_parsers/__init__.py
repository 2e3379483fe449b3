"""The stand-in vLLM's tool-call parser registry: the real release's names, recorded."""

import standin_engine


class ToolParserManager:
    @classmethod
    def list_registered(cls):
        return standin_engine.parser_names("tool")

    @classmethod
    def import_tool_parser(cls, plugin_path):
        standin_engine.load_parser_plugin("tool", plugin_path)
