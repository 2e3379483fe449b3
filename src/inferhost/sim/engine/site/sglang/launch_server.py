"""``python -m sglang.launch_server``: the stand-in server, refusing what the recorded SGLang refuses."""

import sys

import openai_standin

if __name__ == "__main__":
    sys.exit(openai_standin.main())
