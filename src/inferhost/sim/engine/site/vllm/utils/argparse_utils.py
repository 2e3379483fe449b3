"""The stand-in vLLM's parser class: plain argparse (the recording leaves vLLM's extra spellings out)."""

from argparse import ArgumentParser as FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
