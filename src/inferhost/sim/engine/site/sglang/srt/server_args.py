"""The stand-in SGLang's server arguments: the real release's, recorded (src/inferhost/sim/engine/standin_engine.py),
and the device-free checks engine_check asks of them, as the stand-in keeps them."""

import standin_engine


class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        standin_engine.add_arguments(parser, "sglang")

    @classmethod
    def from_cli_args(cls, args):
        server_args = cls.__new__(cls)  # the values as parsed, nothing resolved (the real one would, at start)
        vars(server_args).update(vars(args))
        return server_args

    def _handle_tokenizer_batching(self):
        standin_engine.sglang_tokenizer_batching(self)

    def _handle_cache_compatibility(self):
        standin_engine.sglang_cache_compatibility(self)

    def _handle_other_validations(self):
        standin_engine.sglang_other_validations(self)

    def validate_buckets_rule(self, arg_name, buckets_rule):
        """Not kept by the stand-in."""
