"""The stand-in ``vllm serve`` arguments: the real release's, recorded (src/inferhost/sim/engine/standin_engine.py)."""

import standin_engine


def make_arg_parser(parser):
    return standin_engine.add_arguments(parser, "vllm")


def validate_parsed_serve_args(args):
    """vLLM's checks right after parsing, as the stand-in keeps them."""
    standin_engine.vllm_validate_parsed_serve_args(args)
