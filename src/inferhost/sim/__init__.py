"""Everything that pretends: the simulated GPUs (a model of the PCI driver core, served over FUSE where a
real command must see it), the host's commands, the Proxmox API in memory, the stand-in engines and apt
repositories. The lab and the tests install and use it; nothing in roles/ or plugins/ may reach it (a static
test holds that), so no setting of a real host can point the stack at a fake."""

from pathlib import Path

# The stand-in engines (a server with the OpenAI API, the real releases' recorded parsers and registries) and
# the playbook that installs them on a machine.
ENGINE_DIR = Path(__file__).resolve().parent / "engine"
