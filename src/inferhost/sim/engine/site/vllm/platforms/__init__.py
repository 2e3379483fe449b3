"""The stand-in vLLM's platform: a resolved one, as on a guest with GPUs (the check selects none)."""


class StandinPlatform:
    def is_unspecified(self):
        return False


current_platform = StandinPlatform()
