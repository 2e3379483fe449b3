"""The stand-in SGLang's server arguments: the real release's, recorded (src/inferhost/sim/engine/standin_engine.py)."""

import standin_engine


class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        standin_engine.add_arguments(parser, "sglang")
