"""The stand-in vLLM API server's check of its arguments (the parser names), as the stand-in keeps it."""

import standin_engine


def validate_api_server_args(args):
    standin_engine.vllm_validate_api_server_args(args)
