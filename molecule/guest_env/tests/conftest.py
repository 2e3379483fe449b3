"""The fixtures of this scenario's journeys (at: a step's state on the instance under test)."""

from molecule_play import at, journey_states  # noqa: F401  (pytest fixtures)
